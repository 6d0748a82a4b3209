#!/bin/sh
# sessions-import.sh - PUT /v1/sessions/ID/state: replaces the memory of
# session ID with FILE (made by sessions-export.sh), or creates the session
# for model NAME when NAME is given. Prints the session.
#   usage: sessions-import.sh ID FILE [NAME]
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
#   SPANSERVE_API_KEY  sent as "Authorization: Bearer KEY" when set
set -eu
[ $# = 2 ] || [ $# = 3 ] || { echo "usage: $0 ID FILE [NAME]" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    -X PUT -H 'Content-Type: application/octet-stream' --data-binary "@$2" \
    "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/sessions/$1/state${3:+?model=$3}"
