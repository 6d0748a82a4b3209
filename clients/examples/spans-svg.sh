#!/bin/sh
# spans-svg.sh - GET /v1/models/NAME/spans?format=svg: the same report as a
# picture (image/svg+xml): adaptive-span, a layers x heads heat map of the
# spans; PAR, the blocks with their architecture weights.
#   usage: spans-svg.sh [NAME] > spans.svg     NAME: default $MODEL, else aspan
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
#   SPANSERVE_API_KEY  sent as "Authorization: Bearer KEY" when set
set -eu
name=${1:-${MODEL:-aspan}}
exec curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/models/$name/spans?format=svg"
