#!/bin/sh
# models-delete.sh - DELETE /v1/models/NAME: unloads the model and deletes its
# sessions. Prints {"deleted": "NAME"}.
#   usage: models-delete.sh NAME
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
#   SPANSERVE_API_KEY  sent as "Authorization: Bearer KEY" when set
set -eu
[ $# = 1 ] || { echo "usage: $0 NAME" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    -X DELETE "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/models/$1"
