#!/bin/sh
# deploy/move-session.sh - moves sessions from one spanserve to another.
#
#   deploy/move-session.sh FROM_URL TO_URL ID...
#
# For each ID: exports the session's memory from FROM (GET
# /v1/sessions/ID/state), imports it into TO under the same id and model (PUT
# /v1/sessions/ID/state?model=M), checks that TO reports the same tokens_seen,
# then deletes it from FROM. Every request carries `X-Session-Id: ID`, so TO
# may be the Ingress (or Envoy): the session lands on the replica it now
# hashes to. FROM is the replica that holds it, by its own address (in
# Kubernetes, http://spanserve-N.spanserve-headless.spanserve.svc:8080, or
# `kubectl port-forward pod/spanserve-N`).
#
# A session that TO already has is left alone: when TO's memory of it is the
# same, byte for byte, TO reaches the replica that holds it and there is
# nothing to move ("in place"); otherwise another session has that id there
# (a conflict: exit 1). So after a change of replicas,
#   deploy/move-session.sh REPLICA_URL INGRESS_URL $(ids of REPLICA's sessions)
# moves exactly the sessions that now hash elsewhere.
# Both servers must serve the model under the same name, with the same
# weights and --memory mode, or TO refuses the state (409 or 400).
#
# SPANSERVE_API_KEY: the bearer key, when the servers require one.
# Exits 1 if any session could not be moved; a session is deleted from FROM
# only once TO holds it.
set -u
[ $# -ge 3 ] || { echo "usage: $0 FROM_URL TO_URL ID..." >&2; exit 2; }
from=${1%/}; to=${2%/}; shift 2
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
auth=${SPANSERVE_API_KEY:+Authorization: Bearer $SPANSERVE_API_KEY}

# call METHOD URL ID [curl args...]: prints the body, returns the HTTP status in $status
call() {
    m=$1; u=$2; id=$3; shift 3
    status=$(curl -sS -o "$tmp/body" -w '%{http_code}' -X "$m" -H "X-Session-Id: $id" ${auth:+-H "$auth"} "$@" "$u") || status=000
}
field() { sed -n "s/.*\"$1\": *\"\{0,1\}\([^\",}]*\).*/\1/p" "$tmp/body"; }

bad=0
for id in "$@"; do
    call GET "$from/v1/sessions/$id" "$id"
    if [ "$status" != 200 ]; then echo "$id: not on $from ($status): $(cat "$tmp/body")"; bad=1; continue; fi
    model=$(field model); seen=$(field tokens_seen)
    call GET "$from/v1/sessions/$id/state" "$id"
    if [ "$status" != 200 ]; then echo "$id: export from $from failed ($status): $(cat "$tmp/body")"; bad=1; continue; fi
    mv "$tmp/body" "$tmp/state"
    call GET "$to/v1/sessions/$id/state" "$id"
    if [ "$status" = 200 ]; then
        if cmp -s "$tmp/body" "$tmp/state"; then
            echo "$id: in place ($to reaches the replica that holds it)"
        else
            echo "$id: $to has another session of that id: left alone"; bad=1
        fi
        continue
    fi
    call PUT "$to/v1/sessions/$id/state?model=$model" "$id" -H 'Content-Type: application/octet-stream' --data-binary "@$tmp/state"
    if [ "$status" != 200 ]; then echo "$id: import into $to failed ($status): $(cat "$tmp/body")"; bad=1; continue; fi
    if [ "$(field tokens_seen)" != "$seen" ]; then echo "$id: $to reports tokens_seen $(field tokens_seen), $from $seen: left on both"; bad=1; continue; fi
    call DELETE "$from/v1/sessions/$id" "$id"
    if [ "$status" != 200 ]; then echo "$id: moved, but deleting it from $from failed ($status): $(cat "$tmp/body")"; bad=1; continue; fi
    echo "$id: moved from $from to $to (model $model, $seen tokens seen, $(wc -c < "$tmp/state") bytes)"
done
exit $bad
