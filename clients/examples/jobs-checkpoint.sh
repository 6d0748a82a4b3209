#!/bin/sh
# jobs-checkpoint.sh - GET /v1/jobs/ID/checkpoint: the job's last checkpoint
# (safetensors, the layout the server loads), during training or after, to
# standard output. 404 while the job has none.
#   usage: jobs-checkpoint.sh ID > model.safetensors
#   SPANSERVE_JOBS_URL   the jobs listener (default http://127.0.0.1:8081)
#   SPANSERVE_ADMIN_KEY  sent as "Authorization: Bearer KEY" (the jobs API needs one)
set -eu
[ $# = 1 ] || { echo "usage: $0 ID > model.safetensors" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_ADMIN_KEY:+-H "Authorization: Bearer $SPANSERVE_ADMIN_KEY"} \
    "${SPANSERVE_JOBS_URL:-http://127.0.0.1:8081}/v1/jobs/$1/checkpoint"
