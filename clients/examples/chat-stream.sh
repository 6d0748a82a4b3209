#!/bin/sh
# chat-stream.sh - POST /v1/chat/completions with "stream": true, the OpenAI
# way: `data: {chunk}` events ("object": "chat.completion.chunk"), the first
# with the assistant's role, then whose choices[0].delta.content is the next
# piece, one with the finish_reason, a last one with the usage
# ("stream_options": {"include_usage": true}), then `data: [DONE]`.
#   usage: chat-stream.sh [NAME [MESSAGE]]   NAME: default $MODEL, else aspan;
#                                            MESSAGE: default "Wherefore art thou?"
#   SYSTEM (none), MAX_TOKENS (64), TEMPERATURE (1), SEED (drawn when unset)
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
message=${2-Wherefore art thou?}
messages=""
[ -z "${SYSTEM:-}" ] || messages="{\"role\": \"system\", \"content\": $(printf '%s' "$SYSTEM" | json_str)}, "
messages="$messages{\"role\": \"user\", \"content\": $(printf '%s' "$message" | json_str)}"
extra=""
[ -z "${SEED:-}" ] || extra="$extra, \"seed\": $SEED"
# -N: print each event as it arrives
exec curl -sS -N --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
    -H 'Content-Type: application/json' \
    -d "{\"model\": \"$model\", \"messages\": [$messages], \"max_tokens\": ${MAX_TOKENS:-64},
         \"temperature\": ${TEMPERATURE:-1}$extra, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
    "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/chat/completions"
