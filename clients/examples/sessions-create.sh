#!/bin/sh
# sessions-create.sh - POST /v1/sessions: a new session (a stream's carried
# memory) for model NAME. 201 and the session; 409 if the id exists.
#   usage: sessions-create.sh [NAME [ID]]   NAME: default $MODEL, else aspan;
#                                           ID: default, the server makes one
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
#   SPANSERVE_API_KEY  sent as "Authorization: Bearer KEY" when set
set -eu
model=${1:-${MODEL:-aspan}}
id=${2:+", \"id\": \"$2\""}
exec curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    -H 'Content-Type: application/json' -d "{\"model\": \"$model\"$id}" \
    "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/sessions"
