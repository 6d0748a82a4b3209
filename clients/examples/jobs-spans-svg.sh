#!/bin/sh
# jobs-spans-svg.sh - GET /v1/jobs/ID/spans.svg: the spans per layer
# (adaptive-span) or each block's architecture weights (PAR) over the course of
# training, as an SVG picture on standard output.
#   usage: jobs-spans-svg.sh ID > spans.svg
#   SPANSERVE_JOBS_URL   the jobs listener (default http://127.0.0.1:8081)
#   SPANSERVE_ADMIN_KEY  sent as "Authorization: Bearer KEY" (the jobs API needs one)
set -eu
[ $# = 1 ] || { echo "usage: $0 ID" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_ADMIN_KEY:+-H "Authorization: Bearer $SPANSERVE_ADMIN_KEY"} \
    "${SPANSERVE_JOBS_URL:-http://127.0.0.1:8081}/v1/jobs/$1/spans.svg"
