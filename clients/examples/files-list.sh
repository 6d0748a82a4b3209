#!/bin/sh
# files-list.sh - GET /v1/files: the training texts, {"files": [file, ...]}.
#   usage: files-list.sh
#   SPANSERVE_JOBS_URL   the jobs listener (default http://127.0.0.1:8081)
#   SPANSERVE_ADMIN_KEY  sent as "Authorization: Bearer KEY" (the jobs API needs one)
set -eu
[ $# = 0 ] || { echo "usage: $0" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_ADMIN_KEY:+-H "Authorization: Bearer $SPANSERVE_ADMIN_KEY"} \
    "${SPANSERVE_JOBS_URL:-http://127.0.0.1:8081}/v1/files"
