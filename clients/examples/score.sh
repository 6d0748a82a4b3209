#!/bin/sh
# score.sh - POST /v1/score: the mean negative log-likelihood (nats), bits per
# character and perplexity of a text: {"tokens", "nll", "bpc", "ppl"}.
#   usage: score.sh [NAME [FILE]]    NAME: default $MODEL, else aspan;
#                                    FILE: default standard input
#   PER_TOKEN=1 adds "token_logprobs"; SESSION scores in a session, whose memory
#   predicts the text's first token (chunks sent one after another add up to
#   the whole); STRIDE=N: a window model (nanogpt, gpt-adaptive-span) scored in
#   sliding windows of N new tokens (without it: windows of block_size, each alone)
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
extra=""
[ -z "${PER_TOKEN:-}" ] || extra="$extra, \"per_token\": true"
[ -z "${SESSION:-}" ] || extra="$extra, \"session\": \"$SESSION\""
[ -z "${STRIDE:-}" ] || extra="$extra, \"stride\": $STRIDE"
[ "$file" = - ] || exec <"$file"
# The body goes through standard input: a text may be longer than one
# command-line argument can be.
{ printf '{"model": "%s", "text": ' "$model"; json_str; printf '%s}' "$extra"; } |
    curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
        -H 'Content-Type: application/json' --data-binary @- "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/score"
