#!/bin/sh
# sessions-export.sh - GET /v1/sessions/ID/state: writes the session's memory,
# a binary file (application/octet-stream), to FILE. On an error the server's
# JSON goes to standard error and FILE is not left behind.
#   usage: sessions-export.sh ID FILE
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
#   SPANSERVE_API_KEY  sent as "Authorization: Bearer KEY" when set
set -eu
[ $# = 2 ] || { echo "usage: $0 ID FILE" >&2; exit 2; }
rc=0
curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    -o "$2" "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/sessions/$1/state" || rc=$?
if [ $rc != 0 ]; then
    [ -f "$2" ] && cat "$2" >&2 && rm -f "$2"
    exit $rc
fi
