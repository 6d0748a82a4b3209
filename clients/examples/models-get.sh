#!/bin/sh
# models-get.sh - GET /v1/models/NAME: one model: family, parameters,
# vocabulary, config and the memory a stream costs.
#   usage: models-get.sh [NAME]      NAME: default $MODEL, else aspan
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
#   SPANSERVE_API_KEY  sent as "Authorization: Bearer KEY" when set
set -eu
name=${1:-${MODEL:-aspan}}
exec curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/models/$name"
