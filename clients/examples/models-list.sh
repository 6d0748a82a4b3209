#!/bin/sh
# models-list.sh - GET /v1/models: {"object": "list", "data": [...]}, every
# loaded model (OpenAI's list shape).
#   usage: models-list.sh
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
#   SPANSERVE_API_KEY  sent as "Authorization: Bearer KEY" when set
set -eu
exec curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/models"
