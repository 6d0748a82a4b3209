#!/bin/sh
# schemathesis.sh - property-based tests of the HTTP API from its own OpenAPI
# documents: starts `spanserve serve` on a free loopback port with the two
# reference fixtures, points schemathesis (pip package `schemathesis`, see
# .ci/requirements.txt) at GET /openapi.json and lets it generate requests for
# every operation, checking that no response is a 5xx and that every response
# matches the schema the document gives for it. Then the server must still
# answer /healthz, exit 0 on SIGTERM and have logged no sanitizer report.
#
#   sh tests/schemathesis.sh            # 2 to 3 minutes on 2 cores
#   SCHEMATHESIS_SECONDS=30 SCHEMATHESIS_EXAMPLES=10 sh tests/schemathesis.sh
#
# Environment: SPANSERVE_BIN (default bin/spanserve), SPANSERVE_SHARED
# (default ../shared; else the fixtures in tests/), SCHEMATHESIS_SECONDS (time budget, default 80),
# SCHEMATHESIS_JOBS_SECONDS (the jobs listener's, default 30),
# SCHEMATHESIS_EXAMPLES (per operation and phase, default 25),
# SCHEMATHESIS_CHECKS (default not_a_server_error,response_schema_conformance),
# SCHEMATHESIS_SEED (default 1: the same requests every run).
#
# Then the same against the jobs listener (--jobs-listen, an admin key) from
# its own document, server/openapi_jobs.json, for SCHEMATHESIS_JOBS_SECONDS
# (default 30). POST /v1/jobs is left out there: a request it accepts starts
# a training process that outlives the server (tests/test_jobs.py covers
# that route).
#
# POST /v1/models is left out (a url there would make the server download
# from wherever the generator points; the server also runs without
# --model-dir, so it refuses both forms), and so is DELETE /v1/models/{name}
# (it would unload the models that every other operation needs).
# Not named test_*.sh: tests/run.sh does not pick it up; CI calls it.
# Ends with "schemathesis.sh: N passed, N failed".
bin=${SPANSERVE_BIN:-bin/spanserve}
seconds=${SCHEMATHESIS_SECONDS:-80}
examples=${SCHEMATHESIS_EXAMPLES:-25}
checks=${SCHEMATHESIS_CHECKS:-not_a_server_error,response_schema_conformance}
seed=${SCHEMATHESIS_SEED:-1}
cd "$(dirname "$0")/.." || exit 1
. tests/fixtures.sh   # $A, $P

summary() { echo "schemathesis.sh: $1 passed, $2 failed"; [ "$2" = 0 ]; exit $?; }
if ! command -v schemathesis >/dev/null 2>&1; then
    echo "note: schemathesis missing: pip install -r .ci/requirements.txt"
    summary 0 1
fi
[ -x "$bin" ] || { echo "FAIL schemathesis.sh: no server binary at $bin (run make)"; summary 0 1; }

tmp=$(mktemp -d)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
jport=$(free_port)
jobs_seconds=${SCHEMATHESIS_JOBS_SECONDS:-30}
"$bin" serve --listen "127.0.0.1:$port" --jobs-listen "127.0.0.1:$jport" --admin-key schemathesis-admin \
    --model "aspan=$A" --model "par=$P" \
    --state-dir "$tmp/state" --max-tokens 64 --max-prompt 4096 --session-memory 64M \
    >"$tmp/server.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT

ready=0
for _ in $(seq 1 300); do
    if python3 -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$port/readyz', timeout=2).status != 200)" 2>/dev/null; then
        ready=1; break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if [ "$ready" = 0 ]; then
    echo "FAIL schemathesis.sh: the server did not become ready: $(tail -c 500 "$tmp/server.log")"
    summary 0 1
fi

# st NAME URL SECONDS ARGS...: one schemathesis run; adds the failing
# operations (one per failing test case of its JUnit report) to $fail.
fail=0
st() {
    name=$1 url=$2 secs=$3; shift 3
    ( cd "$tmp" && schemathesis run "$url" "$@" \
        --checks "$checks" --max-examples "$examples" --max-time "$secs" --seed "$seed" \
        --request-timeout 30 --no-color --report junit --report-junit-path "$tmp/junit-$name.xml" ) >"$tmp/st-$name.log" 2>&1
    rc=$?
    n=$(python3 - "$tmp/junit-$name.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print(0); sys.exit()
print(sum(1 for tc in root.iter("testcase") if tc.find("failure") is not None or tc.find("error") is not None))
PY
)
    if [ "$rc" != 0 ]; then
        [ "$n" -gt 0 ] 2>/dev/null || n=1
        fail=$((fail + n))
        echo "FAIL schemathesis.sh: schemathesis ($name) exited $rc with $n failing operations:"
        sed -n '/FAILURES/,$p' "$tmp/st-$name.log" | head -n 150
        grep -q FAILURES "$tmp/st-$name.log" || tail -n 60 "$tmp/st-$name.log"
    fi
    grep -E '^ *Test cases:|generated,' "$tmp/st-$name.log" | tail -n 1 | sed "s/^ */note: $name: /"
}
st api "http://127.0.0.1:$port/openapi.json" "$seconds" --exclude-operation-id loadModel --exclude-operation-id deleteModel
st jobs "http://127.0.0.1:$jport/openapi.json" "$jobs_seconds" -H "Authorization: Bearer schemathesis-admin" \
    --exclude-operation-id submitJob

if ! python3 -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=5).status != 200)" 2>/dev/null; then
    echo "FAIL schemathesis.sh: the server stopped answering /healthz: $(tail -c 500 "$tmp/server.log")"
    fail=$((fail + 1))
fi
kill -TERM "$pid" 2>/dev/null
( sleep 60; kill -KILL "$pid" 2>/dev/null ) &
watchdog=$!
wait "$pid"
code=$?
kill "$watchdog" 2>/dev/null
if [ "$code" != 0 ]; then
    echo "FAIL schemathesis.sh: the server exited $code on SIGTERM: $(tail -c 500 "$tmp/server.log")"
    fail=$((fail + 1))
fi
if grep -E 'ERROR: (Address|Undefined|Leak)Sanitizer|runtime error' "$tmp/server.log"; then
    echo "FAIL schemathesis.sh: sanitizer report in the server's log"
    fail=$((fail + 1))
fi
[ "$fail" = 0 ] && summary 1 0
summary 0 "$fail"
