#!/bin/sh
# test_cli.sh - the spanserve command line as a user types it: every
# subcommand's output, --help, and the exit status of wrong arguments.
bin=${SPANSERVE_BIN:-bin/spanserve}
. tests/fixtures.sh   # $A, $P, $TEXT, ref_path
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_cli.sh: $*"; }
# expect STATUS CMD...: runs CMD, checks its exit status
expect() {
    want=$1; shift
    "$@" >"$tmp/out" 2>"$tmp/err"; got=$?
    [ "$got" = "$want" ] && ok || bad "'$*' exited $got, expected $want: $(head -c 300 "$tmp/err")"
}
contains() { grep -q -- "$2" "$1" && ok || bad "$1 lacks '$2': $(head -c 300 "$1")"; }

head -c 2000 "$TEXT" >"$tmp/text.txt"

expect 0 "$bin" --help; contains "$tmp/out" "usage: spanserve COMMAND"
expect 2 "$bin"
expect 2 "$bin" frobnicate; contains "$tmp/err" "unknown command 'frobnicate'"
expect 0 "$bin" version; contains "$tmp/out" "spanserve "
for c in score spans generate; do
    expect 0 "$bin" $c --help; contains "$tmp/out" "usage: spanserve $c"
    expect 2 "$bin" $c; contains "$tmp/err" "--model is required"
    expect 2 "$bin" $c --model "$A" --no-such-flag
done
expect 2 "$bin" score --model "$A"
# a usage error: the problem and where the options are, two lines, not the whole usage
expect 2 "$bin" score --modle "$A" "$tmp/text.txt"; contains "$tmp/err" "unknown option '--modle' (did you mean --model?)"
contains "$tmp/err" "Run 'spanserve score --help' for the options."
[ "$(wc -l <"$tmp/err")" = 2 ] && ok || bad "a usage error is two lines: $(cat "$tmp/err")"
expect 2 "$bin" generate --model "$A" --temprature 1; contains "$tmp/err" "did you mean --temperature?"
expect 2 "$bin" score --model; contains "$tmp/err" "--model needs a value"
expect 2 "$bin" serve --max-queue x; contains "$tmp/err" "--max-queue takes"
[ "$(wc -l <"$tmp/err")" = 2 ] && ok || bad "serve's usage error is two lines: $(head -c 300 "$tmp/err")"
expect 2 "$bin" serve --bogus-flag; contains "$tmp/err" "unknown option '--bogus-flag'"
expect 1 "$bin" score --model "$A" "$tmp/no-such-file"; contains "$tmp/err" "no-such-file: No such file or directory"
[ "$(wc -l <"$tmp/err")" = 1 ] && ok || bad "a missing file is one line: $(cat "$tmp/err")"
# --device: auto falls back to the CPU quietly; cuda says why it cannot; a bad value is a usage error
expect 0 "$bin" score --json --device auto --model "$A" "$tmp/text.txt"; contains "$tmp/out" '"tokens":1999'
expect 0 "$bin" score --device cpu --precision fp32 --model "$A" "$tmp/text.txt"; contains "$tmp/err" "on cpu (fp32)"
expect 2 "$bin" score --device tpu --model "$A" "$tmp/text.txt"; contains "$tmp/err" "--device must be cpu, cuda or auto"
expect 2 "$bin" generate --precision fp16 --model "$A"; contains "$tmp/err" "--precision must be bf16 or fp32"
if ! "$bin" score --device cuda --model "$A" "$tmp/text.txt" >"$tmp/out" 2>"$tmp/err"; then
    contains "$tmp/err" "--device cuda: "
fi
# a progress line on a terminal (stderr a tty), none otherwise
head -c 60000 "$TEXT" >"$tmp/long.txt"
python3 - "$bin" "$A" "$tmp/long.txt" <<'PY' && ok || bad "score's progress line on a terminal"
import os, pty, subprocess, sys
bin, model, text = sys.argv[1:]
m, s = pty.openpty()
p = subprocess.run([bin, "score", "--device", "cpu", "--model", model, text], stdout=subprocess.PIPE, stderr=s, timeout=120)
os.close(s)
got = b""
try:
    while True:
        d = os.read(m, 65536)
        if not d:
            break
        got += d
except OSError:
    pass
assert p.returncode == 0 and b"tokens  59999" in p.stdout, p
assert b"\rscoring" in got.replace(b"\x1b[K", b"") and b"tokens/s  ETA" in got, got[:400]
PY
expect 0 "$bin" score --model "$A" "$tmp/long.txt"
grep -q "ETA" "$tmp/err" && bad "a progress line when stderr is not a terminal" || ok
expect 2 "$bin" generate --model "$A" --top-p 1.5; contains "$tmp/err" "top-p"
expect 2 "$bin" generate --model "$A" --max-tokens -3
expect 2 "$bin" generate --model "$A" --temperature abc
expect 2 "$bin" spans --model "$A" --memory sideways
# serve's durations: seconds or a suffix s, m, h, d; anything else refused before it starts
expect 2 "$bin" serve --job-retention 5x; contains "$tmp/err" "--job-retention takes a duration"
expect 2 "$bin" serve --job-retention -1; contains "$tmp/err" "--job-retention"
expect 2 "$bin" serve --sse-keepalive 2h; contains "$tmp/err" "--sse-keepalive takes 0 to 3600 seconds"
expect 2 "$bin" serve --cancel-grace 2d; contains "$tmp/err" "--cancel-grace takes 0 to 86400 seconds"
expect 2 "$bin" serve --request-timeout 1ms; contains "$tmp/err" "--request-timeout"

# score: JSON fields consistent, the plain text form, both families
for m in "$A" "$P"; do
    expect 0 "$bin" score --json --model "$m" "$tmp/text.txt"
    python3 - "$tmp/out" <<'PY' && ok || bad "score --json output for $m: $(cat "$tmp/out")"
import json, math, sys
r = json.load(open(sys.argv[1]))
assert set(r) == {"tokens", "nll", "bpc", "ppl"}, r
assert r["tokens"] == 1999, r
assert abs(r["bpc"] - r["nll"] / math.log(2)) < 1e-6 and abs(r["ppl"] - math.exp(r["nll"])) < 1e-4 * r["ppl"], r
assert 1.0 < r["bpc"] < 4.0, r
PY
done
expect 0 "$bin" score --model "$A" "$tmp/text.txt"; contains "$tmp/out" "bpc "; contains "$tmp/out" "tokens  1999"
cat "$tmp/text.txt" | "$bin" score --json --model "$A" - >"$tmp/stdin.json" 2>&1 && ok || bad "score from stdin"
expect 0 "$bin" score --json --model "$A" "$tmp/text.txt"
cmp -s "$tmp/out" "$tmp/stdin.json" && ok || bad "stdin and file scores differ"

# errors name the problem
printf 'hello \342\202\254 world' >"$tmp/euro.txt"
expect 1 "$bin" score --model "$A" "$tmp/euro.txt"; contains "$tmp/err" "(U+20AC) at byte 6 is not in the model's vocabulary"
expect 1 "$bin" score --model "$A" "$tmp/missing.txt"; contains "$tmp/err" "No such file"
expect 1 "$bin" score --model "$tmp/text.txt" "$tmp/text.txt"; contains "$tmp/err" "header length"
expect 1 "$bin" score --model "$tmp/nope.safetensors" "$tmp/text.txt"; contains "$tmp/err" "cannot open"
printf 'a' >"$tmp/one.txt"
expect 1 "$bin" score --model "$A" "$tmp/one.txt"; contains "$tmp/err" "nothing to predict"

# spans: JSON as the reference computes; the table form
expect 0 "$bin" spans --json --model "$A"
python3 - "$tmp/out" "$(ref_path fixtures/aspan-small/expected.json)" <<'PY' && ok || bad "spans --json (aspan): $(head -c 400 "$tmp/out")"
import json, sys
r, e = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert r["family"] == "adaptive-span"
for got, want in zip(r["layers"], e["spans"]):
    assert got["max_span"] == want["current_max_span"] and got["avg_span"] == want["current_avg_span"]
    assert got["cache_size"] == want["cache_size"], (got, want)
    for h, z in zip(got["heads"], want["span"]):
        assert abs(h["span"] - z) < 1e-3, (h, z)
m = r["memory"]
assert m["reference_bytes_per_stream"] == sum(s["cache_size"] for s in e["spans"]) * 128 * 4, m
assert m["bytes_per_stream"] > 0 and m["full_span_bytes_per_stream"] == 4 * 512 * 128 * 4
PY
expect 0 "$bin" spans --json --model "$P"
python3 - "$tmp/out" "$(ref_path fixtures/par-small/expected.json)" <<'PY' && ok || bad "spans --json (par): $(head -c 400 "$tmp/out")"
import json, sys
r, e = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert [b["kind"] for b in r["blocks"]] == e["arch"]
for b, sm in zip(r["blocks"], e["alpha_softmax"]):
    assert abs(b["alpha_softmax"]["attn"] - sm[0]) < 1e-6
assert r["memory"]["bytes_per_stream"] == 3 * 2 * 96 * 128 * 4
PY
expect 0 "$bin" spans --model "$A"; contains "$tmp/out" "memory per stream (this server)"
expect 0 "$bin" spans --memory span --model "$A"; contains "$tmp/out" "cache_size"
expect 0 "$bin" spans --model "$P"; contains "$tmp/out" "attn"

# generate: the same seed gives the same text, another seed another, stop strings
expect 0 "$bin" generate --model "$A" --prompt "ROMEO:" --max-tokens 60 --seed 7; cp "$tmp/out" "$tmp/g1"
expect 0 "$bin" generate --model "$A" --prompt "ROMEO:" --max-tokens 60 --seed 7
cmp -s "$tmp/out" "$tmp/g1" && ok || bad "same seed gave different text"
contains "$tmp/err" "60 tokens, finish length"
[ "$(head -c -1 "$tmp/g1" | wc -m)" = 60 ] && ok || bad "60 tokens should be 60 characters: $(cat "$tmp/g1")"
expect 0 "$bin" generate --model "$A" --prompt "ROMEO:" --max-tokens 60 --seed 8
cmp -s "$tmp/out" "$tmp/g1" && bad "seeds 7 and 8 gave the same text" || ok
expect 0 "$bin" generate --model "$P" --prompt "First" --max-tokens 40 --temperature 0 --top-k 5
expect 0 "$bin" generate --model "$A" --prompt "ROMEO:" --max-tokens 60 --seed 7 --stop e
contains "$tmp/err" "finish stop"
python3 - "$tmp/g1" "$tmp/out" <<'PY' && ok || bad "stop string: '$(cat "$tmp/out")' vs '$(cat "$tmp/g1")'"
import sys
full, cut = open(sys.argv[1]).read()[:-1], open(sys.argv[2]).read()[:-1]
assert cut == full[:full.index("e")], (cut, full)
PY
expect 1 "$bin" generate --model "$A" --prompt "caf\303\251"; contains "$tmp/err" "not in the model's vocabulary"

echo "test_cli.sh: $pass passed, $fail failed"
[ "$fail" = 0 ]
