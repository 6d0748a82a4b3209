#!/bin/sh
# jobs-list.sh - GET /v1/jobs: {"jobs": [job, ...]} in the order they were queued.
#   usage: jobs-list.sh [STATUS]   STATUS: queued, running, succeeded, failed or cancelled
#   SPANSERVE_JOBS_URL   the jobs listener (default http://127.0.0.1:8081)
#   SPANSERVE_ADMIN_KEY  sent as "Authorization: Bearer KEY" (the jobs API needs one)
set -eu
[ $# -le 1 ] || { echo "usage: $0 [STATUS]" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_ADMIN_KEY:+-H "Authorization: Bearer $SPANSERVE_ADMIN_KEY"} \
    "${SPANSERVE_JOBS_URL:-http://127.0.0.1:8081}/v1/jobs${1:+?status=$1}"
