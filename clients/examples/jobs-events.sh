#!/bin/sh
# jobs-events.sh - GET /v1/jobs/ID/events: the trainer's progress lines as JSON
# pages {"events", "next", "more"}.
#   usage: jobs-events.sh ID [AFTER]   AFTER: lines to skip (the "next" of a page)
#   SPANSERVE_JOBS_URL   the jobs listener (default http://127.0.0.1:8081)
#   SPANSERVE_ADMIN_KEY  sent as "Authorization: Bearer KEY" (the jobs API needs one)
set -eu
[ $# = 1 ] || [ $# = 2 ] || { echo "usage: $0 ID [AFTER]" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_ADMIN_KEY:+-H "Authorization: Bearer $SPANSERVE_ADMIN_KEY"} \
    "${SPANSERVE_JOBS_URL:-http://127.0.0.1:8081}/v1/jobs/$1/events?after=${2:-0}"
