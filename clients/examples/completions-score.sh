#!/bin/sh
# completions-score.sh - POST /v1/completions with echo, logprobs and
# max_tokens 0: scores a text the OpenAI way. choices[0].logprobs has each of
# the text's tokens, its logprob (null for the first, which nothing predicts),
# the most likely alternative and its offset in the text.
#   usage: completions-score.sh [NAME [FILE]]   NAME: default $MODEL, else
#                                               aspan; FILE: default stdin
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
file=${2:--}
[ "$file" = - ] || exec <"$file"
# The body goes through standard input: a text may be longer than one
# command-line argument can be.
{ printf '{"model": "%s", "prompt": ' "$model"; json_str; printf ', "echo": true, "logprobs": 1, "max_tokens": 0}'; } |
    curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
        -H 'Content-Type: application/json' --data-binary @- "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/completions"
