#!/bin/sh
# spans.sh - GET /v1/models/NAME/spans: what the model learned, as JSON
# (`spanserve spans --json`): adaptive-span, each head's span; PAR, each
# block's kind and architecture weights; both, the memory a stream costs.
#   usage: spans.sh [NAME]           NAME: default $MODEL, else aspan
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
#   SPANSERVE_API_KEY  sent as "Authorization: Bearer KEY" when set
set -eu
name=${1:-${MODEL:-aspan}}
exec curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/models/$name/spans"
