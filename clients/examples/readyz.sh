#!/bin/sh
# readyz.sh - GET /readyz: ready for work? {"status": "ready"}, or 503 (and
# curl's exit status 22) while the server loads or drains. Needs no API key.
#   usage: readyz.sh
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
set -eu
exec curl -sS --fail-with-body "${SPANSERVE_URL:-http://127.0.0.1:8080}/readyz"
