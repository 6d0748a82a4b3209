#!/bin/sh
# test_examples.sh - the clients against the real server: every curl example
# in clients/examples/ and every spanctl command, with assertions on the
# values they print (the same numbers as the command line, the same text for
# the same seed, a session's memory that survives export and import) and on
# the exit status and message of errors. Starts `spanserve serve` on a free
# port (a second one with an API key), and stops them at the end.
bin=${SPANSERVE_BIN:-bin/spanserve}
ctl=${SPANCTL_BIN:-$(dirname "$bin")/spanctl}
. tests/fixtures.sh   # $A, $P, $TEXT
ex=clients/examples
tmp=$(mktemp -d)
pids=""
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_examples.sh: $*"; }
SAN='ERROR: (Address|Undefined|Leak)Sanitizer|runtime error'
# SIGTERM: the server finishes its work, saves its sessions and exits 0.
stop_servers() {
    for p in $pids; do
        kill "$p" 2>/dev/null; wait "$p"; rc=$?
        [ $rc = 0 ] && ok || bad "the server exited $rc after SIGTERM"
    done
    pids=""
    for l in "$tmp"/*.log; do
        [ -e "$l" ] || continue
        grep -E "$SAN" "$l" && bad "the server under the sanitizers: $l"
        mv "$l" "$l.seen"
    done
}
trap 'pids_left=$pids; for p in $pids_left; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
# expect STATUS CMD...: runs CMD (at most 120 s), checks its exit status
expect() {
    want=$1; shift
    timeout 120 "$@" >"$tmp/out" 2>"$tmp/err"; got=$?
    [ "$got" = "$want" ] && ok || bad "'$*' exited $got, expected $want: $(head -c 300 "$tmp/err") $(head -c 300 "$tmp/out")"
    if grep -qE "$SAN" "$tmp/err"; then grep -E "$SAN" "$tmp/err"; bad "'$*' under the sanitizers"; fi
}
contains() { grep -q -- "$2" "$1" && ok || bad "$1 lacks '$2': $(head -c 300 "$1")"; }
# check WHAT ARGS... <<PY: a Python assertion on the files named by ARGS
check() { what=$1; shift; python3 - "$@" && ok || bad "$what"; }
# The error JSON of a failed curl example: its status and type.
check_error() {
    check "$1 should be error $2 $3: $(head -c 300 "$tmp/out")" "$tmp/out" "$2" "$3" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))["error"]
assert e["code"] == int(sys.argv[2]) and e["type"] == sys.argv[3] and e["message"], e
PY
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# start_server NAME ARGS...: starts `spanserve serve` on a free port, sets $url
start_server() {
    name=$1; shift
    port=$(free_port)
    url=http://127.0.0.1:$port
    env -u SPANSERVE_API_KEY "$bin" serve --listen "127.0.0.1:$port" "$@" >"$tmp/$name.log" 2>&1 &
    pids="$pids $!"
    for _ in $(seq 300); do
        curl -sf "$url/readyz" >/dev/null 2>&1 && return 0
        kill -0 "$!" 2>/dev/null || break
        sleep 0.1
    done
    bad "server $name did not become ready: $(tail -n 20 "$tmp/$name.log")"
    return 1
}
finish() {
    echo "test_examples.sh: $pass passed, $fail failed"
    [ "$fail" = 0 ]
    exit
}

head -c 2000 "$TEXT" >"$tmp/text.txt"
head -c 1000 "$tmp/text.txt" >"$tmp/part1.txt"
tail -c +1001 "$tmp/text.txt" >"$tmp/part2.txt"
printf 'hello \342\202\254 world' >"$tmp/euro.txt"
mkdir -p "$tmp/models/sub" "$tmp/state"
cp "$P" "$tmp/models/sub/p.safetensors"
cp "$tmp/text.txt" "$tmp/models/sub/not-a-checkpoint.safetensors"
# What the command line computes, for the server to agree with.
"$bin" score --json --model "$A" "$tmp/text.txt" >"$tmp/cli-score-a.json"
"$bin" score --json --model "$P" "$tmp/text.txt" >"$tmp/cli-score-p.json"
"$bin" score --model "$A" "$tmp/text.txt" >"$tmp/cli-score-a.txt" 2>/dev/null
"$bin" spans --json --model "$A" >"$tmp/cli-spans-a.json"
"$bin" spans --json --model "$P" >"$tmp/cli-spans-p.json"

start_server main --model "aspan=$A" --model "par=$P" --model-dir "$tmp/models" --state-dir "$tmp/state" || finish
main_url=$url
export SPANSERVE_URL="$url"
unset SPANSERVE_API_KEY MODEL SESSION SEED STOP MAX_TOKENS TEMPERATURE PER_TOKEN

# ------------------------------------------------------------ service
expect 0 sh $ex/healthz.sh; contains "$tmp/out" '"ok"'
expect 0 sh $ex/readyz.sh; contains "$tmp/out" '"ready"'
expect 0 sh $ex/openapi.sh
check "openapi.sh is server/openapi.json" "$tmp/out" server/openapi.json <<'PY'
import json, sys
assert json.load(open(sys.argv[1])) == json.load(open(sys.argv[2]))
PY

# ------------------------------------------------------------ models
expect 0 sh $ex/models-list.sh
check "models-list.sh: $(head -c 300 "$tmp/out")" "$tmp/out" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["object"] == "list", j.keys()
m = {x["name"]: x for x in j["data"]}
assert all(x["id"] == x["name"] and x["object"] == "model" and x["owned_by"] == "spanserve" for x in m.values()), m
assert set(m) == {"aspan", "par"}, m.keys()
assert m["aspan"]["family"] == "adaptive-span" and m["par"]["family"] == "par-transformer-xl"
assert m["aspan"]["vocab_size"] == 65 and m["par"]["vocab_size"] == 65
PY
expect 0 sh $ex/models-get.sh aspan
check "models-get.sh aspan: memory as spanserve spans" "$tmp/out" "$tmp/cli-spans-a.json" <<'PY'
import json, sys
m, s = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert m["name"] == "aspan" and m["family"] == "adaptive-span" and m["parameters"] > 0, m
assert m["memory"] == s["memory"], (m["memory"], s["memory"])
assert m["config"]["attn_span"] == 512, m["config"]
PY
expect 0 env MODEL=par sh $ex/models-get.sh; contains "$tmp/out" '"par-transformer-xl"'
expect 22 sh $ex/models-get.sh nope; check_error "models-get.sh nope" 404 not_found
cp "$tmp/out" "$tmp/notfound.json"

expect 0 sh $ex/spans.sh aspan
check "spans.sh aspan is spanserve spans --json" "$tmp/out" "$tmp/cli-spans-a.json" <<'PY'
import json, sys
got, want = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert got.pop("model", "aspan") == "aspan"  # the route may name the model
def same(a, b):
    if isinstance(a, float) or isinstance(b, float): return abs(a - b) <= 1e-6 * max(1, abs(b))
    if isinstance(a, dict): return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list): return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
assert same(got, want), (got, want)
PY
expect 0 sh $ex/spans.sh par
check "spans.sh par is spanserve spans --json" "$tmp/out" "$tmp/cli-spans-p.json" <<'PY'
import json, sys
got, want = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert [b["kind"] for b in got["blocks"]] == [b["kind"] for b in want["blocks"]]
for g, w in zip(got["blocks"], want["blocks"]):
    for k in ("attn", "ffn", "skip"): assert abs(g["alpha_softmax"][k] - w["alpha_softmax"][k]) < 1e-6
assert got["memory"] == want["memory"]
PY
for m in aspan par; do
    expect 0 sh $ex/spans-svg.sh $m
    check "spans-svg.sh $m is an SVG picture: $(head -c 200 "$tmp/out")" "$tmp/out" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag in ("svg", "{http://www.w3.org/2000/svg}svg"), root.tag
assert len(list(root.iter())) > 5
PY
done
expect 22 sh $ex/spans.sh nope; check_error "spans.sh nope" 404 not_found

expect 0 sh $ex/models-load.sh par2 sub/p.safetensors
check "models-load.sh par2: $(head -c 300 "$tmp/out")" "$tmp/out" "$tmp/cli-spans-p.json" <<'PY'
import json, sys
m, s = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert m["name"] == "par2" and m["family"] == "par-transformer-xl" and m["memory"] == s["memory"], m
PY
expect 0 sh $ex/models-list.sh; contains "$tmp/out" '"par2"'
expect 22 sh $ex/models-load.sh par2 sub/p.safetensors; check_error "models-load.sh of a taken name" 409 conflict
expect 22 sh $ex/models-load.sh par3 ../p.safetensors; check_error "models-load.sh ../" 400 invalid_request
expect 22 sh $ex/models-load.sh par3 /etc/passwd; check_error "models-load.sh of an absolute path" 400 invalid_request
expect 22 sh $ex/models-load.sh par3 sub/not-a-checkpoint.safetensors
check_error "models-load.sh of a text file" 400 invalid_request
expect 22 sh $ex/models-load.sh par3 sub/missing.safetensors
expect 22 sh $ex/models-load-url.sh par3 http://127.0.0.1:1/p.safetensors
check_error "models-load-url.sh of an http URL" 400 invalid_request
expect 22 sh $ex/models-get.sh par3; check_error "a model that failed to load" 404 not_found
# a model's sessions go with it
expect 0 sh $ex/sessions-create.sh par2 s-of-par2
expect 0 sh $ex/models-delete.sh par2
check "models-delete.sh par2: $(cat "$tmp/out")" "$tmp/out" <<'PY'
import json, sys
assert json.load(open(sys.argv[1])) == {"deleted": "par2"}
PY
expect 22 sh $ex/models-get.sh par2; check_error "models-get.sh of a deleted model" 404 not_found
expect 22 sh $ex/sessions-get.sh s-of-par2; check_error "a session of a deleted model" 404 not_found
expect 22 sh $ex/models-delete.sh par2; check_error "models-delete.sh twice" 404 not_found

# ------------------------------------------------------------ generation
expect 0 env SEED=7 MAX_TOKENS=60 sh $ex/generate.sh aspan "ROMEO:"; cp "$tmp/out" "$tmp/gen1.json"
expect 0 env SEED=7 MAX_TOKENS=60 sh $ex/generate.sh aspan "ROMEO:"; cp "$tmp/out" "$tmp/gen2.json"
"$bin" generate --model "$A" --prompt "ROMEO:" --max-tokens 60 --seed 7 >"$tmp/cli-gen.txt" 2>/dev/null
check "generate.sh seed 7: $(head -c 300 "$tmp/gen1.json")" "$tmp/gen1.json" "$tmp/gen2.json" "$tmp/cli-gen.txt" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
cli = open(sys.argv[3]).read()[:-1]
assert a["text"] == b["text"], "the same seed gave another text"
assert a["model"] == "aspan" and a["seed"] == 7 and a["finish_reason"] == "length", a
assert len(a["tokens"]) == 60 and len(a["text"]) == 60, a
assert a["usage"] == {"prompt_tokens": 6, "completion_tokens": 60, "total_tokens": 66}, a["usage"]
assert a["timings"]["total_ms"] >= a["timings"]["decode_ms"] >= 0, a["timings"]
assert a["text"] == cli, ("server and command line differ for seed 7", a["text"], cli)
PY
expect 0 env SEED=8 MAX_TOKENS=60 sh $ex/generate.sh aspan "ROMEO:"
check "seeds 7 and 8 gave the same text" "$tmp/gen1.json" "$tmp/out" <<'PY'
import json, sys
assert json.load(open(sys.argv[1]))["text"] != json.load(open(sys.argv[2]))["text"]
PY
expect 0 env MAX_TOKENS=5 sh $ex/generate.sh aspan
check "generate.sh without a seed returns the one drawn: $(head -c 300 "$tmp/out")" "$tmp/out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert isinstance(r["seed"], int) and r["seed"] >= 0 and len(r["text"]) == 5, r
PY
expect 0 env SEED=7 MAX_TOKENS=60 STOP=e sh $ex/generate.sh aspan "ROMEO:"
check "generate.sh STOP=e: $(head -c 300 "$tmp/out")" "$tmp/gen1.json" "$tmp/out" <<'PY'
import json, sys
full, cut = json.load(open(sys.argv[1]))["text"], json.load(open(sys.argv[2]))
assert "e" in full and cut["text"] == full[:full.index("e")] and cut["finish_reason"] == "stop", (full, cut)
PY
expect 0 env SEED=7 MAX_TOKENS=60 TEMPERATURE=0 sh $ex/generate.sh par "First"
"$bin" generate --model "$P" --prompt "First" --max-tokens 60 --temperature 0 >"$tmp/cli-greedy.txt" 2>/dev/null
check "greedy generation of par: server and command line" "$tmp/out" "$tmp/cli-greedy.txt" <<'PY'
import json, sys
assert json.load(open(sys.argv[1]))["text"] == open(sys.argv[2]).read()[:-1]
PY
expect 0 env SEED=7 MAX_TOKENS=60 sh $ex/generate-stream.sh aspan "ROMEO:"; cp "$tmp/out" "$tmp/stream.txt"
check "generate-stream.sh: $(head -c 300 "$tmp/stream.txt")" "$tmp/stream.txt" "$tmp/gen1.json" <<'PY'
import json, sys
events, ev, data = [], None, []
for line in open(sys.argv[1]).read().split("\n"):
    if line.startswith("event:"): ev = line[6:].strip()
    elif line.startswith("data:"): data.append(line[5:].lstrip(" "))
    elif line == "" and (ev or data):
        events.append((ev, json.loads("\n".join(data)))); ev, data = None, []
toks = [d for e, d in events if e == "token"]
done = [d for e, d in events if e == "done"]
assert len(done) == 1 and events[-1][0] == "done", [e for e, _ in events]
assert [t["index"] for t in toks] == list(range(60)), [t["index"] for t in toks]
assert all(t["logprob"] <= 0 for t in toks)
assert "".join(t["text"] for t in toks) == done[0]["text"] == json.load(open(sys.argv[2]))["text"]
assert [t["token"] for t in toks] == done[0]["tokens"]
assert done[0]["seed"] == 7 and done[0]["usage"]["completion_tokens"] == 60
PY
expect 22 env MAX_TOKENS=5000 sh $ex/generate.sh aspan; check_error "generate.sh MAX_TOKENS=5000" 400 invalid_request
contains "$tmp/out" max_tokens
expect 22 env TEMPERATURE=-1 sh $ex/generate.sh aspan; check_error "generate.sh TEMPERATURE=-1" 400 invalid_request
expect 22 sh $ex/generate.sh nope; check_error "generate.sh of an unknown model" 404 not_found
expect 22 sh $ex/generate.sh aspan "$(cat "$tmp/euro.txt")"; check_error "generate.sh of a euro sign" 422 unprocessable
contains "$tmp/out" "U+20AC"

# ------------------------------------------------------------ scoring
for m in aspan par; do
    expect 0 sh $ex/score.sh $m "$tmp/text.txt"; cp "$tmp/out" "$tmp/score-$m.json"
    check "score.sh $m is spanserve score --json: $(cat "$tmp/out")" "$tmp/out" "$tmp/cli-score-$(echo $m | head -c 1).json" <<'PY'
import json, sys
got, want = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert got["tokens"] == want["tokens"] == 1999, (got, want)
for k in ("nll", "bpc", "ppl"): assert abs(got[k] - want[k]) <= 1e-6 * want[k], (k, got, want)
PY
done
expect 0 env PER_TOKEN=1 sh $ex/score.sh aspan <"$tmp/text.txt"
check "score.sh PER_TOKEN=1 from stdin" "$tmp/out" "$tmp/score-aspan.json" <<'PY'
import json, sys
r, whole = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
lp = r["token_logprobs"]
assert len(lp) == 1999 and all(x <= 0 for x in lp)
assert abs(-sum(lp) / len(lp) - whole["nll"]) < 1e-5 and abs(r["bpc"] - whole["bpc"]) < 1e-6
PY
expect 22 sh $ex/score.sh aspan "$tmp/euro.txt"; check_error "score.sh of a euro sign" 422 unprocessable
contains "$tmp/out" "byte 6"
printf 'a' >"$tmp/one.txt"
expect 22 sh $ex/score.sh aspan "$tmp/one.txt"; check_error "score.sh of one character" 400 invalid_request

expect 22 env STRIDE=8 sh $ex/score.sh aspan "$tmp/text.txt"; check_error "score.sh STRIDE=8 of a model with a memory" 400 invalid_request
contains "$tmp/out" "stride"

# ------------------------------------------------------------ attention
head -c 200 "$tmp/text.txt" >"$tmp/short.txt"
expect 0 sh $ex/attention.sh aspan "$tmp/short.txt"
check "attention.sh: every layer and head, 8 keys a row" "$tmp/out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert len(r["tokens"]) == 200 and r["heads"], r.keys()
for h in r["heads"]:
    assert len(h["rows"]) == 200
    for row in h["rows"]:
        assert len(row["keys"]) <= 8 and all(k < row["query"] for k in row["keys"]), row
        assert all(a >= b for a, b in zip(row["weights"], row["weights"][1:])), row
PY
expect 0 env LAYER=1 HEAD=0 FORMAT=svg sh $ex/attention.sh aspan "$tmp/short.txt"
check "attention.sh FORMAT=svg: one head's heat map" "$tmp/out" <<'PY'
import sys, xml.etree.ElementTree as ET
assert ET.parse(sys.argv[1]).getroot().tag.endswith("svg")
PY
expect 22 env FORMAT=svg sh $ex/attention.sh aspan "$tmp/short.txt"; check_error "attention.sh FORMAT=svg without a head" 400 invalid_request

# ------------------------------------------------------------ completions
expect 0 env SEED=7 MAX_TOKENS=60 sh $ex/completions.sh aspan "ROMEO:"; cp "$tmp/out" "$tmp/cmpl.json"
check "completions.sh: $(head -c 300 "$tmp/out")" "$tmp/out" "$tmp/gen1.json" <<'PY'
import json, sys
r, g = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert r["object"] == "text_completion" and r["model"] == "aspan" and r["id"].startswith("cmpl-"), r
c = r["choices"]
assert len(c) == 1 and c[0]["index"] == 0 and c[0]["finish_reason"] == "length", c
assert c[0]["text"] == g["text"], ("completions and generate differ for seed 7", c[0]["text"], g["text"])
assert r["usage"] == {"prompt_tokens": 6, "completion_tokens": 60, "total_tokens": 66}, r["usage"]
PY
expect 0 sh $ex/completions-score.sh aspan "$tmp/text.txt"
check "completions-score.sh: the prompt's logprobs are spanserve score's" "$tmp/out" "$tmp/text.txt" "$tmp/score-aspan.json" <<'PY'
import json, sys
r, text, s = json.load(open(sys.argv[1])), open(sys.argv[2]).read(), json.load(open(sys.argv[3]))
c = r["choices"][0]
lp = c["logprobs"]
assert c["text"] == text and r["usage"]["prompt_tokens"] == 2000 and r["usage"]["completion_tokens"] == 0, r["usage"]
assert lp["tokens"] == list(text) and lp["text_offset"] == list(range(2000))
assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
nll = -sum(lp["token_logprobs"][1:]) / 1999
assert abs(nll - s["nll"]) < 1e-5, (nll, s["nll"])
assert all(len(t) >= 1 and max(t.values()) >= x - 1e-6 for t, x in zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:]))
PY
expect 0 env SEED=7 MAX_TOKENS=60 sh $ex/completions-stream.sh aspan "ROMEO:"
check "completions-stream.sh: $(head -c 300 "$tmp/out")" "$tmp/out" "$tmp/cmpl.json" <<'PY'
import json, sys
data = [l[5:].strip() for l in open(sys.argv[1]).read().split("\n") if l.startswith("data:")]
assert data[-1] == "[DONE]", data[-3:]
chunks = [json.loads(d) for d in data[:-1]]
assert all(c["object"] == "text_completion" for c in chunks)
assert "".join(c["choices"][0]["text"] for c in chunks) == json.load(open(sys.argv[2]))["choices"][0]["text"]
PY

# ------------------------------------------------------------ chat
expect 0 env SEED=7 MAX_TOKENS=60 SYSTEM="A street in Verona." sh $ex/chat.sh aspan "Wherefore art thou?"; cp "$tmp/out" "$tmp/chat.json"
check "chat.sh: $(head -c 300 "$tmp/out")" "$tmp/out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["object"] == "chat.completion" and r["model"] == "aspan" and r["id"].startswith("chatcmpl-"), r
c = r["choices"]
assert len(c) == 1 and c[0]["message"]["role"] == "assistant" and c[0]["finish_reason"] in ("stop", "length"), c
assert "\n\n" not in c[0]["message"]["content"], c
prompt = "SYSTEM:\nA street in Verona.\n\nUSER:\nWherefore art thou?\n\nASSISTANT:\n"   # docs/API.md's template
assert r["usage"]["prompt_tokens"] == len(prompt), (r["usage"], len(prompt))
PY
expect 0 env SEED=7 MAX_TOKENS=60 SYSTEM="A street in Verona." sh $ex/chat-stream.sh aspan "Wherefore art thou?"
check "chat-stream.sh: $(head -c 300 "$tmp/out")" "$tmp/out" "$tmp/chat.json" <<'PY'
import json, sys
data = [l[5:].strip() for l in open(sys.argv[1]).read().split("\n") if l.startswith("data:")]
assert data[-1] == "[DONE]", data[-3:]
chunks = [json.loads(d) for d in data[:-1]]
whole = json.load(open(sys.argv[2]))
assert all(c["object"] == "chat.completion.chunk" for c in chunks)
assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}, chunks[0]
text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
assert text == whole["choices"][0]["message"]["content"], (text, whole)
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"], chunks[-1]
PY
expect 22 sh $ex/chat.sh aspan "caf$(printf '\303\251')"; check_error "chat.sh with an accent" 422 unprocessable
contains "$tmp/out" "messages\[0\].content"

# ------------------------------------------------------------ sessions
expect 0 sh $ex/sessions-create.sh aspan doc1
check "sessions-create.sh aspan doc1: $(cat "$tmp/out")" "$tmp/out" "$tmp/cli-spans-a.json" <<'PY'
import json, re, sys
s, spans = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert s["id"] == "doc1" and s["model"] == "aspan" and s["tokens_seen"] == 0 and s["location"] == "memory", s
assert s["memory_bytes"] == spans["memory"]["bytes_per_stream"], s
assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", s["created"]), s
PY
expect 22 sh $ex/sessions-create.sh aspan doc1; check_error "sessions-create.sh of a taken id" 409 conflict
expect 22 sh $ex/sessions-create.sh nope; check_error "sessions-create.sh of an unknown model" 404 not_found
expect 0 sh $ex/sessions-create.sh par; cp "$tmp/out" "$tmp/anon.json"
check "sessions-create.sh without an id: $(cat "$tmp/out")" "$tmp/out" <<'PY'
import json, re, sys
s = json.load(open(sys.argv[1]))
assert re.match(r"^[A-Za-z0-9._-]{1,64}$", s["id"]) and s["model"] == "par", s
PY
anon=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"])' "$tmp/anon.json")
expect 0 sh $ex/sessions-list.sh
check "sessions-list.sh: $(head -c 300 "$tmp/out")" "$tmp/out" "$anon" <<'PY'
import json, sys
ids = {s["id"]: s["model"] for s in json.load(open(sys.argv[1]))["sessions"]}
assert ids.get("doc1") == "aspan" and ids.get(sys.argv[2]) == "par", ids
PY
# a text scored in two chunks through a session adds up to the whole
expect 0 env SESSION=doc1 sh $ex/score.sh aspan "$tmp/part1.txt"; cp "$tmp/out" "$tmp/c1.json"
expect 0 env SESSION=doc1 sh $ex/score.sh aspan "$tmp/part2.txt"; cp "$tmp/out" "$tmp/c2.json"
check "two chunks in session doc1 add up to the whole" "$tmp/c1.json" "$tmp/c2.json" "$tmp/score-aspan.json" <<'PY'
import json, sys
a, b, w = (json.load(open(f)) for f in sys.argv[1:4])
assert a["session"] == b["session"] == "doc1", (a, b)
assert a["tokens"] == 999 and b["tokens"] == 1000, (a["tokens"], b["tokens"])
nll = (a["nll"] * a["tokens"] + b["nll"] * b["tokens"]) / 1999
assert abs(nll - w["nll"]) < 1e-5, (nll, w["nll"])
PY
expect 0 sh $ex/sessions-get.sh doc1
check "sessions-get.sh doc1 after 2000 tokens: $(cat "$tmp/out")" "$tmp/out" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["id"] == "doc1" and s["tokens_seen"] == 2000, s
PY
# export, import as doc2: the same memory predicts the same
expect 0 sh $ex/sessions-export.sh doc1 "$tmp/doc1.state"
[ -s "$tmp/doc1.state" ] && ok || bad "sessions-export.sh wrote nothing"
expect 0 sh $ex/sessions-import.sh doc2 "$tmp/doc1.state" aspan
check "sessions-import.sh doc2: $(cat "$tmp/out")" "$tmp/out" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["id"] == "doc2" and s["model"] == "aspan" and s["tokens_seen"] == 2000, s
PY
printf 'And so to bed.\n' >"$tmp/more.txt"
expect 0 env PER_TOKEN=1 SESSION=doc1 sh $ex/score.sh aspan "$tmp/more.txt"; cp "$tmp/out" "$tmp/m1.json"
expect 0 env PER_TOKEN=1 SESSION=doc2 sh $ex/score.sh aspan "$tmp/more.txt"; cp "$tmp/out" "$tmp/m2.json"
check "an imported session predicts as its original" "$tmp/m1.json" "$tmp/m2.json" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a["tokens"] == b["tokens"] == 15 and a["token_logprobs"] == b["token_logprobs"], (a, b)
PY
expect 0 env SESSION=doc2 SEED=3 MAX_TOKENS=20 sh $ex/generate.sh aspan "ROMEO:"
check "generate.sh in a session: $(head -c 300 "$tmp/out")" "$tmp/out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["session"] == "doc2" and len(r["text"]) == 20, r
PY
expect 0 sh $ex/sessions-import.sh doc2 "$tmp/doc1.state"
check "sessions-import.sh replaces doc2's memory: $(cat "$tmp/out")" "$tmp/out" <<'PY'
import json, sys
assert json.load(open(sys.argv[1]))["tokens_seen"] == 2000
PY
expect 0 sh $ex/sessions-export.sh "$anon" "$tmp/par.state"
expect 22 sh $ex/sessions-import.sh doc2 "$tmp/par.state"; check_error "importing a par state into an aspan session" 409 conflict
contains "$tmp/out" "model"
expect 22 sh $ex/sessions-import.sh doc3 "$tmp/text.txt" aspan; check_error "sessions-import.sh of a text file" 400 invalid_request
expect 22 sh $ex/sessions-import.sh doc3 "$tmp/doc1.state"; check_error "sessions-import.sh of a new id without a model" 404 not_found
expect 22 sh $ex/sessions-export.sh nope "$tmp/nope.state"; tail -n 1 "$tmp/err" >"$tmp/out"  # the error went to stderr
check_error "sessions-export.sh nope" 404 not_found
[ -e "$tmp/nope.state" ] && bad "sessions-export.sh left a file behind" || ok
expect 0 sh $ex/sessions-delete.sh doc2
check "sessions-delete.sh doc2" "$tmp/out" <<'PY'
import json, sys
assert json.load(open(sys.argv[1])) == {"deleted": "doc2"}
PY
expect 22 sh $ex/sessions-get.sh doc2; check_error "sessions-get.sh of a deleted session" 404 not_found

# ------------------------------------------------------------ spanctl
expect 0 "$ctl" --help; contains "$tmp/out" "usage: spanctl"
expect 2 "$ctl"; contains "$tmp/err" "a command is required"
expect 2 "$ctl" frobnicate; contains "$tmp/err" "unknown command 'frobnicate'"
expect 2 "$ctl" --no-such-flag models
for c in generate score spans models sessions; do
    expect 0 "$ctl" $c --help; contains "$tmp/out" "usage: spanctl $c"
    expect 2 "$ctl" $c --no-such-flag
done
expect 2 "$ctl" generate; contains "$tmp/err" "--model"
expect 2 "$ctl" generate --model aspan --max-tokens abc
expect 2 "$ctl" generate --model aspan --temperature warm
expect 2 "$ctl" generate --model aspan extra
expect 2 "$ctl" score --model aspan
expect 2 "$ctl" score "$tmp/text.txt"
expect 2 "$ctl" spans
expect 2 "$ctl" models frobnicate
expect 2 "$ctl" models get
expect 2 "$ctl" models load x
expect 2 "$ctl" sessions get
expect 2 "$ctl" sessions export doc1
expect 2 "$ctl" sessions get doc1 --model aspan
expect 1 "$ctl" --url http://127.0.0.1:1 models list; contains "$tmp/err" "onnect"
expect 0 "$ctl" --url http://127.0.0.1:1 models list --url "$main_url"
expect 0 env -u SPANSERVE_URL "$ctl" --url "$main_url/" models

expect 0 "$ctl" models list
check "spanctl models list: $(cat "$tmp/out")" "$tmp/out" <<'PY'
import sys
rows = {l.split()[0]: l.split() for l in open(sys.argv[1]).read().splitlines()[1:]}
assert set(rows) == {"aspan", "par"} and rows["aspan"][1] == "adaptive-span" and rows["par"][1] == "par-transformer-xl", rows
PY
expect 0 "$ctl" models list --json; contains "$tmp/out" '"object":"list","data":'
expect 0 "$ctl" models get par; contains "$tmp/out" '"name": "par"'
expect 1 "$ctl" models get nope
msg=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["error"]["message"])' "$tmp/notfound.json")
contains "$tmp/err" "$msg"
expect 0 "$ctl" models load par3 sub/p.safetensors; contains "$tmp/out" '"name": "par3"'
expect 1 "$ctl" models load par3 sub/p.safetensors; contains "$tmp/err" "409 conflict"
expect 1 "$ctl" models load-url par4 http://127.0.0.1:1/p.safetensors; contains "$tmp/err" "400 invalid_request"
expect 0 "$ctl" models delete par3; contains "$tmp/out" "deleted par3"
expect 1 "$ctl" models delete par3; contains "$tmp/err" "404 not_found"

expect 0 "$ctl" spans aspan
check "spanctl spans aspan: the table of spanserve spans" "$tmp/out" "$tmp/cli-spans-a.json" <<'PY'
import json, sys
got, want = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
assert got.startswith("adaptive-span: maximum span"), got[:200]
assert str(want["memory"]["bytes_per_stream"]) in got and len([l for l in got.splitlines() if l[:5].strip().isdigit()]) == len(want["layers"]), got
PY
expect 0 "$ctl" spans aspan --json
check "spanctl spans aspan --json" "$tmp/out" "$tmp/cli-spans-a.json" <<'PY'
import json, sys
got, want = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert got["memory"] == want["memory"] and len(got["layers"]) == len(want["layers"])
PY
expect 0 "$ctl" spans par --svg; contains "$tmp/out" "</svg>"
expect 1 "$ctl" spans nope; contains "$tmp/err" "404 not_found"

expect 0 "$ctl" score --json --model aspan "$tmp/text.txt"
check "spanctl score --json is spanserve score --json" "$tmp/out" "$tmp/cli-score-a.json" <<'PY'
import json, sys
got, want = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert got["tokens"] == want["tokens"] and abs(got["bpc"] - want["bpc"]) <= 1e-6 * want["bpc"], (got, want)
PY
expect 0 "$ctl" score --model aspan "$tmp/text.txt"
check "spanctl score prints as spanserve score: $(cat "$tmp/out")" "$tmp/out" "$tmp/cli-score-a.txt" <<'PY'
import sys
got, want = (dict(l.split(None, 1) for l in open(f).read().splitlines()) for f in sys.argv[1:3])
assert got.keys() == want.keys() == {"tokens", "nll", "bpc", "ppl"} and got["tokens"] == want["tokens"] == "1999"
for k in ("nll", "bpc", "ppl"): assert abs(float(got[k].split()[0]) - float(want[k].split()[0])) < 2e-6 * float(want[k].split()[0]), (got, want)
PY
"$ctl" score --model aspan - <"$tmp/text.txt" >"$tmp/stdin.txt" 2>&1 && cmp -s "$tmp/out" "$tmp/stdin.txt" && ok || bad "spanctl score - differs: $(cat "$tmp/stdin.txt")"
expect 0 "$ctl" score --per-token --model par "$tmp/text.txt"
check "spanctl score --per-token: one line per prediction" "$tmp/out" "$tmp/cli-score-p.json" <<'PY'
import sys, json
lines = open(sys.argv[1]).read().splitlines()
lp = [float(l.split("\t")[1]) for l in lines[4:]]
assert len(lp) == 1999 and [int(l.split("\t")[0]) for l in lines[4:]] == list(range(1999))
assert abs(-sum(lp) / 1999 - json.load(open(sys.argv[2]))["nll"]) < 1e-5
PY
expect 1 "$ctl" score --model aspan "$tmp/euro.txt"; contains "$tmp/err" "U+20AC"; contains "$tmp/err" "422 unprocessable"
expect 1 "$ctl" score --model aspan "$tmp/missing.txt"; contains "$tmp/err" "No such file"

expect 0 "$ctl" generate --model aspan --prompt "ROMEO:" --max-tokens 60 --seed 7; cp "$tmp/out" "$tmp/ctl-g1"
contains "$tmp/err" "60 tokens, finish length, seed 7"
expect 0 "$ctl" generate --model aspan --prompt "ROMEO:" --max-tokens 60 --seed 7
cmp -s "$tmp/out" "$tmp/ctl-g1" && ok || bad "spanctl generate: the same seed gave another text"
check "spanctl generate prints generate.sh's text" "$tmp/ctl-g1" "$tmp/gen1.json" <<'PY'
import json, sys
assert open(sys.argv[1]).read() == json.load(open(sys.argv[2]))["text"] + "\n"
PY
expect 0 "$ctl" generate --no-stream --model aspan --prompt "ROMEO:" --max-tokens 60 --seed 7
cmp -s "$tmp/out" "$tmp/ctl-g1" && ok || bad "spanctl generate --no-stream differs from the stream"
contains "$tmp/err" "finish length, seed 7"
expect 0 "$ctl" generate --model aspan --prompt "ROMEO:" --max-tokens 60 --seed 7 --stop e --stop zzz
contains "$tmp/err" "finish stop"
check "spanctl generate --stop e" "$tmp/out" "$tmp/ctl-g1" <<'PY'
import sys
cut, full = open(sys.argv[1]).read()[:-1], open(sys.argv[2]).read()[:-1]
assert cut == full[:full.index("e")], (cut, full)
PY
expect 1 "$ctl" generate --model aspan --max-tokens 5000; contains "$tmp/err" "max_tokens"; contains "$tmp/err" "400 invalid_request"
expect 1 "$ctl" generate --model aspan --top-p 0; contains "$tmp/err" "top_p"
expect 1 "$ctl" generate --model nope; contains "$tmp/err" "404 not_found"
expect 1 "$ctl" generate --model aspan --prompt "caf$(printf '\303\251')"; contains "$tmp/err" "422 unprocessable"

expect 0 "$ctl" sessions create aspan s-ctl; contains "$tmp/out" "^s-ctl$"
expect 1 "$ctl" sessions create aspan s-ctl; contains "$tmp/err" "409 conflict"
expect 0 "$ctl" sessions create par
python3 -c 'import re, sys; assert re.match(r"^[A-Za-z0-9._-]{1,64}\n$", open(sys.argv[1]).read())' "$tmp/out" && ok || bad "spanctl sessions create prints the id: $(cat "$tmp/out")"
expect 0 "$ctl" generate --session s-ctl --prompt "ROMEO:" --max-tokens 20 --seed 1
contains "$tmp/err" "session s-ctl"
expect 0 "$ctl" sessions get s-ctl
check "spanctl sessions get s-ctl: $(cat "$tmp/out")" "$tmp/out" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["id"] == "s-ctl" and s["model"] == "aspan" and s["tokens_seen"] >= 25, s
PY
expect 0 "$ctl" sessions list; contains "$tmp/out" "^s-ctl  *aspan "
expect 0 "$ctl" sessions list --json; contains "$tmp/out" '"s-ctl"'
expect 0 "$ctl" sessions export s-ctl "$tmp/s-ctl.state"
expect 0 "$ctl" sessions import s-ctl2 "$tmp/s-ctl.state" --model aspan; contains "$tmp/out" '"id": "s-ctl2"'
"$ctl" sessions export s-ctl2 - >"$tmp/s-ctl2.state" && [ -s "$tmp/s-ctl2.state" ] && ok || bad "spanctl sessions export to stdout"
# the memory went across: both sessions continue alike
expect 0 "$ctl" generate --session s-ctl --max-tokens 30 --seed 5; cp "$tmp/out" "$tmp/cont1"
expect 0 "$ctl" generate --session s-ctl2 --max-tokens 30 --seed 5
cmp -s "$tmp/out" "$tmp/cont1" && ok || bad "an imported session continues differently: '$(cat "$tmp/out")' vs '$(cat "$tmp/cont1")'"
expect 0 "$ctl" generate --model aspan --prompt "ROMEO:" --max-tokens 30 --seed 5
cmp -s "$tmp/out" "$tmp/cont1" && bad "a session's memory made no difference" || ok
expect 0 "$ctl" sessions import s-ctl2 "$tmp/s-ctl.state"; contains "$tmp/out" '"id": "s-ctl2"'
expect 1 "$ctl" sessions import s-ctl2 "$tmp/par.state"; contains "$tmp/err" "409 conflict"
expect 1 "$ctl" sessions import s-ctl3 "$tmp/text.txt" --model aspan; contains "$tmp/err" "400 invalid_request"
expect 0 "$ctl" score --session s-ctl --json "$tmp/more.txt"
check "spanctl score --session: every character predicted" "$tmp/out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["tokens"] == 15 and r["session"] == "s-ctl", r
PY
expect 0 "$ctl" sessions delete s-ctl2; contains "$tmp/out" "deleted s-ctl2"
expect 1 "$ctl" sessions get s-ctl2; contains "$tmp/err" "404 not_found"
expect 1 "$ctl" sessions delete s-ctl2; contains "$tmp/err" "404 not_found"
expect 1 "$ctl" sessions export s-ctl2 "$tmp/none.state"
[ -e "$tmp/none.state" ] && bad "spanctl sessions export wrote a file for an error" || ok

# ------------------------------------------------------------ metrics
expect 0 sh $ex/metrics.sh
check "metrics.sh counts what was done: $(grep -E '^spanserve_tokens' "$tmp/out")" "$tmp/out" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def value(name):
    m = re.search(r"^" + re.escape(name) + r"(\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)
    assert m, name
    return float(m.group(2))
assert value("spanserve_tokens_generated_total") >= 600
assert value("spanserve_tokens_scored_total") >= 5 * 1999
assert re.search(r'^spanserve_requests_total\{[^}]*status="404"[^}]*\} [1-9]', text, re.M)
assert re.search(r'^spanserve_sessions\{state="live"\} [1-9]', text, re.M)
assert "# TYPE spanserve_request_seconds histogram" in text
PY

# ------------------------------------------------------------ sessions survive a restart
expect 0 sh $ex/sessions-export.sh doc1 "$tmp/doc1-final.state"
stop_servers
start_server again --model "aspan=$A" --model "par=$P" --model-dir "$tmp/models" --state-dir "$tmp/state" || finish
export SPANSERVE_URL="$url"
expect 0 sh $ex/sessions-get.sh doc1
check "doc1 after a restart: $(cat "$tmp/out")" "$tmp/out" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["id"] == "doc1" and s["tokens_seen"] == 2015, s
PY
expect 0 env PER_TOKEN=1 SESSION=doc1 sh $ex/score.sh aspan "$tmp/more.txt"; cp "$tmp/out" "$tmp/r1.json"
expect 0 sh $ex/sessions-import.sh doc1-copy "$tmp/doc1-final.state" aspan
expect 0 env PER_TOKEN=1 SESSION=doc1-copy sh $ex/score.sh aspan "$tmp/more.txt"
check "doc1 predicts after a restart as its state before it" "$tmp/out" "$tmp/r1.json" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a["tokens"] == 15 and a["token_logprobs"] == b["token_logprobs"], (a, b)
PY
stop_servers

# ------------------------------------------------------------ an API key
start_server keyed --model "aspan=$A" --state-dir "$tmp/state2" --api-key s3cret || finish
export SPANSERVE_URL="$url"
expect 0 sh $ex/healthz.sh
expect 0 sh $ex/readyz.sh
expect 22 sh $ex/models-list.sh; check_error "models-list.sh without the key" 401 unauthorized
expect 22 env SPANSERVE_API_KEY=wrong sh $ex/metrics.sh; check_error "metrics.sh with a wrong key" 401 unauthorized
expect 0 env SPANSERVE_API_KEY=s3cret sh $ex/models-list.sh; contains "$tmp/out" '"aspan"'
expect 0 env SPANSERVE_API_KEY=s3cret SEED=7 MAX_TOKENS=60 sh $ex/generate.sh aspan "ROMEO:"
check "generate.sh with the key" "$tmp/out" "$tmp/gen1.json" <<'PY'
import json, sys
assert json.load(open(sys.argv[1]))["text"] == json.load(open(sys.argv[2]))["text"]
PY
expect 1 "$ctl" models list; contains "$tmp/err" "401 unauthorized"
expect 0 "$ctl" --api-key s3cret models list; contains "$tmp/out" "aspan"
expect 0 env SPANSERVE_API_KEY=s3cret "$ctl" score --model aspan "$tmp/text.txt"; contains "$tmp/out" "tokens  1999"
expect 1 env SPANSERVE_API_KEY=wrong "$ctl" generate --model aspan --max-tokens 3; contains "$tmp/err" "401 unauthorized"
stop_servers


# ------------------------------------------------------------ training jobs (the jobs listener)
jport=$(free_port)
mkdir -p "$tmp/models3"
start_server jobs --model "aspan=$A" --state-dir "$tmp/state3" --model-dir "$tmp/models3" --data-dir "$tmp/data3" \
    --jobs-listen "127.0.0.1:$jport" --admin-key adm1n || finish
export SPANSERVE_URL="$url" SPANSERVE_JOBS_URL="http://127.0.0.1:$jport"
unset SPANSERVE_ADMIN_KEY
head -c 20000 "$TEXT" >"$tmp/train.txt"
expect 22 sh $ex/jobs-list.sh; check_error "jobs-list.sh without the admin key" 401 unauthorized
export SPANSERVE_ADMIN_KEY=adm1n
expect 0 sh $ex/files-upload.sh "$tmp/train.txt" shakespeare
check "files-upload.sh: $(head -c 300 "$tmp/out")" "$tmp/out" "$tmp/train.txt" <<'PY'
import json, sys
f, text = json.load(open(sys.argv[1])), open(sys.argv[2], encoding="utf-8").read()
assert f["name"] == "shakespeare" and f["bytes"] == len(text.encode()) and f["characters"] == len(text), f
open(sys.argv[1] + ".id", "w").write(f["id"])
PY
fid=$(cat "$tmp/out.id")
expect 0 sh $ex/files-list.sh; contains "$tmp/out" "\"$fid\""
TINY='{"hidden_size": 16, "inner_hidden_size": 32, "nb_heads": 2, "nb_layers": 2, "attn_span": 32, "block_size": 16, "batch_size": 4, "steps": 200, "log_every": 20, "eval_every": 100, "checkpoint_every": 100, "eval_tokens": 500}'
expect 0 env NAME=ex-model DEPLOY=1 sh $ex/jobs-submit.sh adaptive-span "$fid" "$TINY" ex-1
contains "$tmp/out" '"id":"ex-1"'
expect 0 env NAME=ex-model DEPLOY=1 sh $ex/jobs-submit.sh adaptive-span "$fid" "$TINY" ex-1   # a retry: the same job
contains "$tmp/out" '"id":"ex-1"'
expect 0 sh $ex/jobs-events-stream.sh ex-1
check "jobs-events-stream.sh follows the job to its end: $(tail -c 300 "$tmp/out")" "$tmp/out" <<'PY'
import json, sys
evs = [[l for l in b.split("\n") if not l.startswith("id: ")] for b in open(sys.argv[1]).read().split("\n\n") if b.strip()]
names = [b[0].removeprefix("event: ") for b in evs]
assert names[0] == "job" and names[1] == "start" and names[-2] == "done" and names[-1] == "job", names
assert json.loads(evs[-1][1].removeprefix("data: "))["status"] == "succeeded"
PY
expect 0 sh $ex/jobs-get.sh ex-1
check "jobs-get.sh: succeeded and deployed: $(head -c 300 "$tmp/out")" "$tmp/out" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["status"] == "succeeded" and j["step"] == 200 and j["model"]["deployed"] is True, j
PY
expect 0 sh $ex/generate.sh ex-model "ROMEO:"; contains "$tmp/out" '"model":"ex-model"'
expect 0 sh $ex/jobs-events.sh ex-1 10
check "jobs-events.sh after 10" "$tmp/out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["events"][-1]["event"] == "done" and r["next"] == 10 + len(r["events"]) and r["more"] is False, r
PY
expect 0 sh $ex/jobs-list.sh succeeded; contains "$tmp/out" '"ex-1"'
expect 0 sh $ex/jobs-spans-svg.sh ex-1; contains "$tmp/out" "<svg"; contains "$tmp/out" "polyline"
expect 0 sh $ex/jobs-checkpoint.sh ex-1
cmp -s "$tmp/out" "$tmp/models3/ex-model.safetensors" && ok || bad "jobs-checkpoint.sh: not the job's model file"
expect 0 "$ctl" jobs download ex-1 "$tmp/ex-1.safetensors"
cmp -s "$tmp/ex-1.safetensors" "$tmp/models3/ex-model.safetensors" && ok || bad "spanctl jobs download: not the job's model file"
expect 0 sh $ex/jobs-submit.sh adaptive-span "$fid" '{"hidden_size": 16, "inner_hidden_size": 32, "nb_heads": 2, "nb_layers": 1, "attn_span": 32, "block_size": 16, "batch_size": 4, "steps": 1000000, "log_every": 50, "checkpoint_every": 100}' ex-long
expect 22 sh $ex/files-delete.sh "$fid"; check_error "files-delete.sh of a text in use" 409 conflict
for _ in $(seq 300); do sh $ex/jobs-get.sh ex-long 2>/dev/null | grep -q '"checkpoint"' && break; sleep 0.1; done
expect 0 sh $ex/jobs-cancel.sh ex-long
for _ in $(seq 300); do sh $ex/jobs-get.sh ex-long 2>/dev/null | grep -q '"status":"cancelled"' && break; sleep 0.1; done
expect 0 sh $ex/jobs-get.sh ex-long; contains "$tmp/out" '"status":"cancelled"'
expect 0 sh $ex/jobs-resume.sh ex-long; contains "$tmp/out" '"status":"\(queued\|running\)"'
expect 0 sh $ex/jobs-cancel.sh ex-long
expect 22 sh $ex/jobs-submit.sh adaptive-span "$fid" '{"nb_heads": 0}'; check_error "jobs-submit.sh with a bad config" 400 invalid_request
contains "$tmp/out" "nb_heads"
expect 22 sh $ex/jobs-get.sh nope; check_error "jobs-get.sh nope" 404 not_found
for _ in $(seq 300); do sh $ex/jobs-get.sh ex-long 2>/dev/null | grep -q '"status":"cancelled"' && break; sleep 0.1; done
expect 0 sh $ex/files-delete.sh "$fid"; contains "$tmp/out" "\"deleted\":\"$fid\""
expect 22 sh $ex/jobs-delete.sh ex-nope; check_error "jobs-delete.sh of an unknown job" 404 not_found
expect 0 sh $ex/jobs-delete.sh ex-long; contains "$tmp/out" '"deleted":"ex-long"'
expect 22 sh $ex/jobs-get.sh ex-long; check_error "jobs-get.sh of a deleted job" 404 not_found
expect 22 sh $ex/jobs-checkpoint.sh ex-long; check_error "jobs-checkpoint.sh of a deleted job" 404 not_found
expect 0 "$ctl" jobs list; contains "$tmp/out" "^ex-1  *succeeded  *adaptive-span  *200/200"
unset SPANSERVE_ADMIN_KEY SPANSERVE_JOBS_URL
stop_servers

finish
