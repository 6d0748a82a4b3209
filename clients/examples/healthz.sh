#!/bin/sh
# healthz.sh - GET /healthz: is the process alive? Prints {"status": "ok"}.
# Needs no API key.
#   usage: healthz.sh
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
set -eu
exec curl -sS --fail-with-body "${SPANSERVE_URL:-http://127.0.0.1:8080}/healthz"
