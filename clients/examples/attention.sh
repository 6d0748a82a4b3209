#!/bin/sh
# attention.sh - POST /v1/attention: for each position of a short text (at
# most 1024 tokens), every layer and head, the weights over the positions it
# saw: {"tokens", "heads": [{"layer", "head", "rows": [{"query", "sum",
# "keys", "weights", ...}]}]}.
#   usage: attention.sh [NAME [FILE]]    NAME: default $MODEL, else aspan;
#                                        FILE: default standard input
#   LAYER and HEAD (both): that head's whole rows; TOP_K: the heaviest keys a
#   row lists otherwise (default 8); FORMAT=svg (with LAYER and HEAD): its
#   heat map, an SVG document
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
[ -z "${LAYER:-}" ] || extra="$extra, \"layer\": $LAYER"
[ -z "${HEAD:-}" ] || extra="$extra, \"head\": $HEAD"
[ -z "${TOP_K:-}" ] || extra="$extra, \"top_k\": $TOP_K"
[ -z "${FORMAT:-}" ] || extra="$extra, \"format\": \"$FORMAT\""
[ "$file" = - ] || exec <"$file"
{ printf '{"model": "%s", "text": ' "$model"; json_str; printf '%s}' "$extra"; } |
    curl -sS --fail-with-body ${SPANSERVE_API_KEY:+-H "Authorization: Bearer $SPANSERVE_API_KEY"} \
        -H 'Content-Type: application/json' --data-binary @- "${SPANSERVE_URL:-http://127.0.0.1:8080}/v1/attention"
