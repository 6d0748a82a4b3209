#!/bin/sh
# run.sh - builds tests/load/load.c, starts `spanserve serve` with the two
# reference fixtures on a free loopback port, runs the load generator against
# it (arguments are passed on: --seconds, --sessions, --max-tokens, --model)
# and stops the server. `make load` runs this.
#   sh tests/load/run.sh --seconds 30
#   SPANSERVE_SERVE_ARGS="--device cuda" sh tests/load/run.sh    # more server flags
#   LOAD_BIN=path/to/load ...                                      # a prebuilt generator
bin=${SPANSERVE_BIN:-bin/spanserve}
cd "$(dirname "$0")/../.." || exit 1
. tests/fixtures.sh   # $A, $P
mkdir -p build
load=${LOAD_BIN:-build/load}
if [ -z "$LOAD_BIN" ] && { [ ! -x build/load ] || [ tests/load/load.c -nt build/load ]; }; then
    ${CC:-cc} -std=c11 -O2 -Wall -Wextra -Werror tests/load/load.c $(pkg-config --cflags --libs libcurl) -o build/load || exit 2
fi
tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" serve --listen "127.0.0.1:$port" \
    --model "aspan=$A" --model "par=$P" \
    --state-dir "$tmp/state" $SPANSERVE_SERVE_ARGS >"$tmp/server.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 1 300); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/readyz', timeout=2)" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { echo "run.sh: the server exited: $(tail -c 500 "$tmp/server.log")"; exit 2; }
    sleep 0.1
done
grep -m1 "model aspan" "$tmp/server.log"
"$load" --url "http://127.0.0.1:$port" "$@"
rc=$?
kill -TERM "$pid"
wait "$pid" || { echo "run.sh: the server exited $? on SIGTERM"; rc=1; }
exit $rc
