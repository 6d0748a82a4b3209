#!/bin/sh
# completions.sh - POST /v1/completions, OpenAI-compatible: {"id", "object":
# "text_completion", "choices": [{"text", "finish_reason", ...}], "usage"}.
#   usage: completions.sh [NAME [PROMPT]]   NAME: default $MODEL, else aspan;
#                                           PROMPT: default "ROMEO:"
#   MAX_TOKENS (16), TEMPERATURE (1), SEED (drawn when unset)
#   SPANSERVE_URL      the server (default http://127.0.0.1:8080)
#   SPANSERVE_API_KEY  sent as "Authorization: Bearer KEY" when set
set -eu
# json_str: standard input as a JSON string (backslashes, quotes, tabs and
# newlines escaped), for building the request with curl alone.
json_str() {
    { cat; echo; } | sed 's/\\/\\\\/g; s/"/\\"/g; s/\t/\\t/g; s/\r/\\r/g' |
        awk 'BEGIN { ORS = ""; print "\"" } NR > 1 { print "\\n" } { print } END { print "\"" }'
}
model=${1:-${MODEL:-aspan}}
prompt=${2-ROMEO:}
extra=""
[ -z "${SEED:-}" ] || extra="$extra, \"seed\": $SEED"
exec curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    -H 'Content-Type: application/json' \
    -d "{\"model\": \"$model\", \"prompt\": $(printf '%s' "$prompt" | json_str), \"max_tokens\": ${MAX_TOKENS:-16},
         \"temperature\": ${TEMPERATURE:-1}$extra}" \
    "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/completions"
