#!/bin/sh
# jobs-delete.sh - DELETE /v1/jobs/ID: a finished job (succeeded, failed or
# cancelled) and its directory: log, checkpoint and state. A model it put in
# --model-dir stays. 200 {"deleted": "ID"}; 409 for a queued or running job.
#   usage: jobs-delete.sh ID
#   SPANSERVE_JOBS_URL   the jobs listener (default http://127.0.0.1:8081)
#   SPANSERVE_ADMIN_KEY  sent as "Authorization: Bearer KEY" (the jobs API needs one)
set -eu
[ $# = 1 ] || { echo "usage: $0 ID" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_ADMIN_KEY:+-H "Authorization: Bearer $SPANSERVE_ADMIN_KEY"} \
    -X DELETE "${SPANSERVE_JOBS_URL:-http://127.0.0.1:8081}/v1/jobs/$1"
