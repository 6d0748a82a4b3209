#!/bin/sh
# Runs every test binary and script, adds their counts up, and ends with
# "N passed, N failed, N skipped" (each skip named above it).
# Usage: tests/run.sh BUILD_DIR SPANSERVE_BINARY
build=${1:-build}
export SPANSERVE_BIN=${2:-bin/spanserve}
export SPANSERVE_SHARED=${SPANSERVE_SHARED:-../shared}
if [ ! -d "$SPANSERVE_SHARED/fixtures" ]; then
    echo "note: no $SPANSERVE_SHARED (set SPANSERVE_SHARED): the small fixtures come from tests/fixtures; tests that need the larger ones say SKIP"
fi
# The fixtures that come as a trainer's checkpoint, converted for the tests
export SPANSERVE_CONVERTED=${SPANSERVE_CONVERTED:-$build/fixtures}
sh tests/convert_fixtures.sh "$build"
# The Python packages of tests/requirements.txt: python3's own, or a virtual
# environment in build/venv
pybin=$(sh tests/venv.sh)
[ -n "$pybin" ] && PATH=$pybin:$PATH && export PATH
pass=0; fail=0
log=$(mktemp); skips=$(mktemp)
for t in "$build"/tests/test_* tests/test_*.sh; do
    [ -e "$t" ] || continue
    case "$t" in *.sh) cmd="sh $t" ;; *) cmd="$t" ;; esac
    t0=$(date +%s)
    $cmd >"$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    p=$(echo "$line" | sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed.*/\1/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed.*/\2/')
    [ -n "$line" ] || { p=0; f=1; }
    [ $rc -ne 0 ] && [ "$f" = 0 ] && f=1
    grep -E '^(FAIL|SKIP|note)' "$log"
    grep -E '^SKIP' "$log" >>"$skips"
    grep -E 'ERROR: (Address|Undefined|Leak)Sanitizer|runtime error' "$log" && f=$((f + 1))
    if [ "$f" != 0 ]; then echo "--- $t (exit $rc) ---"; tail -n 30 "$log"; fi
    echo "$(basename "$t"): $p passed, $f failed ($secs s)"
    pass=$((pass + p)); fail=$((fail + f))
done
s=$(($(wc -l <"$skips")))
if [ "$s" != 0 ]; then echo "skipped:"; sed 's/^/    /' "$skips"; fi
rm -f "$log" "$skips"
echo "$pass passed, $fail failed, $s skipped"
[ "$fail" = 0 ]
