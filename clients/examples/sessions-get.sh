#!/bin/sh
# sessions-get.sh - GET /v1/sessions/ID: the session's model, tokens seen,
# memory bytes, times, and whether it is in memory or on disk.
#   usage: sessions-get.sh ID
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
#   SPANSERVE_API_KEY  sent as "Authorization: Bearer KEY" when set
set -eu
[ $# = 1 ] || { echo "usage: $0 ID" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/sessions/$1"
