#!/bin/sh
# jobs-cancel.sh - POST /v1/jobs/ID/cancel: a queued job is cancelled at once; a
# running one gets SIGTERM (SIGKILL after --cancel-grace) and keeps its last
# checkpoint. 200 and the job.
#   usage: jobs-cancel.sh ID
#   SPANSERVE_JOBS_URL   the jobs listener (default http://127.0.0.1:8081)
#   SPANSERVE_ADMIN_KEY  sent as "Authorization: Bearer KEY" (the jobs API needs one)
set -eu
[ $# = 1 ] || { echo "usage: $0 ID" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_ADMIN_KEY:+-H "Authorization: Bearer $SPANSERVE_ADMIN_KEY"} \
    -X POST "${SPANSERVE_JOBS_URL:-http://127.0.0.1:8081}/v1/jobs/$1/cancel"
