#!/bin/sh
# models-load.sh - POST /v1/models {"name", "path"}: loads a checkpoint from
# the server's --model-dir under the name NAME. 201 and the model.
#   usage: models-load.sh NAME PATH   PATH relative to the server's --model-dir
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
#   SPANSERVE_API_KEY  sent as "Authorization: Bearer KEY" when set
set -eu
[ $# = 2 ] || { echo "usage: $0 NAME PATH" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    -H 'Content-Type: application/json' -d "{\"name\": \"$1\", \"path\": \"$2\"}" \
    "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/models"
