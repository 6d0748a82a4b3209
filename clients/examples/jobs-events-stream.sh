#!/bin/sh
# jobs-events-stream.sh - GET /v1/jobs/ID/events?stream=true: server-sent
# events that follow the job live: `event: job` (the job) first, one event per
# progress line named by its "event" (start, train, checkpoint, done, ...),
# and `event: job` again when it ends; then the stream closes.
#   usage: jobs-events-stream.sh ID
#   SPANSERVE_JOBS_URL   the jobs listener (default http://127.0.0.1:8081)
#   SPANSERVE_ADMIN_KEY  sent as "Authorization: Bearer KEY" (the jobs API needs one)
set -eu
[ $# = 1 ] || { echo "usage: $0 ID" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_ADMIN_KEY:+-H "Authorization: Bearer $SPANSERVE_ADMIN_KEY"} \
    -N "${SPANSERVE_JOBS_URL:-http://127.0.0.1:8081}/v1/jobs/$1/events?stream=true"
