#!/bin/sh
# files-upload.sh - POST /v1/files: uploads a training text (UTF-8) into the
# server's data directory. 201 and the file: {"id", "name", "bytes",
# "characters", "distinct_characters", "created"}.
#   usage: files-upload.sh FILE [NAME]   NAME: shown in listings (default: the id)
#   SPANSERVE_JOBS_URL   the jobs listener (default http://127.0.0.1:8081)
#   SPANSERVE_ADMIN_KEY  sent as "Authorization: Bearer KEY" (the jobs API needs one)
set -eu
[ $# = 1 ] || [ $# = 2 ] || { echo "usage: $0 FILE [NAME]" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_ADMIN_KEY:+-H "Authorization: Bearer $SPANSERVE_ADMIN_KEY"} \
    -H 'Content-Type: text/plain' --data-binary "@$1" "${SPANSERVE_JOBS_URL:-http://127.0.0.1:8081}/v1/files${2:+?name=$2}"
