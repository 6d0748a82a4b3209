#!/bin/sh
# jobs-submit.sh - POST /v1/jobs: trains a model of FAMILY on the uploaded
# file FILE_ID with the trainer's config keys of CONFIG (a JSON object: model
# sizes and training settings, README "Training"). 201 and the job (queued);
# the same ID and request again answer 200 with the same job.
#   usage: jobs-submit.sh FAMILY FILE_ID CONFIG [ID]
#     FAMILY: adaptive-span or par-transformer-xl; CONFIG: e.g. '{"steps": 500}'
#   NAME (the model's name), DEPLOY=1 (load it when done), WEBHOOK (an http(s) URL
#   that receives the final job), DEVICE (cpu or cuda)
#   SPANSERVE_JOBS_URL   the jobs listener (default http://127.0.0.1:8081)
#   SPANSERVE_ADMIN_KEY  sent as "Authorization: Bearer KEY" (the jobs API needs one)
set -eu
[ $# = 3 ] || [ $# = 4 ] || { echo "usage: $0 FAMILY FILE_ID CONFIG [ID]" >&2; exit 2; }
extra=""
[ -z "${4:-}" ] || extra="$extra, \"id\": \"$4\""
[ -z "${NAME:-}" ] || extra="$extra, \"name\": \"$NAME\""
[ -z "${DEPLOY:-}" ] || extra="$extra, \"deploy\": true"
[ -z "${WEBHOOK:-}" ] || extra="$extra, \"webhook\": \"$WEBHOOK\""
[ -z "${DEVICE:-}" ] || extra="$extra, \"device\": \"$DEVICE\""
exec curl -sS --fail-with-body ${SPANSERVE_ADMIN_KEY:+-H "Authorization: Bearer $SPANSERVE_ADMIN_KEY"} \
    -H 'Content-Type: application/json' -d "{\"family\": \"$1\", \"file\": \"$2\", \"config\": $3$extra}" \
    "${SPANSERVE_JOBS_URL:-http://127.0.0.1:8081}/v1/jobs"
