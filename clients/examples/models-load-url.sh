#!/bin/sh
# models-load-url.sh - POST /v1/models {"name", "url"}: the server fetches an
# https URL into its --model-dir (at most --max-download bytes) and loads it.
#   usage: models-load-url.sh NAME URL
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
#   SPANSERVE_API_KEY  sent as "Authorization: Bearer KEY" when set
set -eu
[ $# = 2 ] || { echo "usage: $0 NAME URL" >&2; exit 2; }
exec curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    -H 'Content-Type: application/json' -d "{\"name\": \"$1\", \"url\": \"$2\"}" \
    "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/models"
