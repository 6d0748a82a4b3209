#!/bin/sh
# test_train.sh - `spanserve train` as a user runs it, on a slice of
# tiny_shakespeare, for both families: the loss falls, the checkpoint loads
# and scores with spanserve, a resumed run equals one that never stopped
# (every logged number and the checkpoint's bytes), the same seed gives the
# same run and another seed another, and bad configs fail naming the key.
bin=${SPANSERVE_BIN:-bin/spanserve}
. tests/fixtures.sh   # $TEXT
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_train.sh: $*"; }
# expect STATUS CMD...: runs CMD, checks its exit status
expect() {
    want=$1; shift
    "$@" >"$tmp/out" 2>"$tmp/err"; got=$?
    [ "$got" = "$want" ] && ok || bad "'$*' exited $got, expected $want: $(head -c 300 "$tmp/err")"
}
contains() { grep -q -- "$2" "$1" && ok || bad "$1 lacks '$2': $(head -c 300 "$1")"; }

head -c 60000 "$TEXT" >"$tmp/text.txt"
python3 -c "import sys; t=open(sys.argv[1]).read(); open(sys.argv[2],'w').write(t[int(0.9*len(t)):])" "$tmp/text.txt" "$tmp/val.txt"

cat >"$tmp/aspan.json" <<EOF
{"family": "adaptive-span", "data": "$tmp/text.txt", "out": "$tmp/aspan.safetensors",
 "hidden_size": 32, "inner_hidden_size": 64, "nb_heads": 4, "nb_layers": 2, "attn_span": 80,
 "block_size": 16, "batch_size": 8, "adapt_span_ramp": 8, "adapt_span_init": 0.1, "steps": 60,
 "log_every": 10, "eval_every": 30, "eval_tokens": 2000, "checkpoint_every": 20, "lr": 0.07, "lr_warmup": 10,
 "dropout": 0.1, "emb_dropout": 0.05}
EOF
cat >"$tmp/par.json" <<EOF
{"family": "par-transformer-xl", "data": "$tmp/text.txt", "out": "$tmp/par.safetensors",
 "n_blocks": 4, "n_head": 2, "d_model": 32, "d_head": 16, "d_inner": 64, "mem_len": 16, "tgt_len": 16,
 "batch_size": 8, "steps": 60, "search_steps": 40, "log_every": 10, "eval_every": 30, "eval_tokens": 2000,
 "checkpoint_every": 20, "lr": 0.003, "arch_lr": 0.03, "tau_start": 1.0, "tau_end": 0.1,
 "dropout": 0.1, "dropatt": 0.1}
EOF

# the log's numbers, without the wall-clock ones
numbers() {
    python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    for k in ("tokens_per_s", "seconds"):
        d.pop(k, None)
    if d["event"] not in ("start", "resume"):
        print(json.dumps(d, sort_keys=True))
PY
}

for fam in aspan par; do
    cfg=$tmp/$fam.json; ck=$tmp/$fam.safetensors
    expect 0 "$bin" train --config "$cfg" --log "$tmp/$fam.log"
    [ -s "$tmp/out" ] && bad "$fam: --log still wrote to stdout: $(head -c 200 "$tmp/out")" || ok
    python3 - "$tmp/$fam.log" "$fam" <<'PY' && ok || bad "$fam: the training log: $(tail -n 3 "$tmp/$fam.log")"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
fam = sys.argv[2]
assert rows[0]["event"] == "start" and rows[-1]["event"] == "done", rows[0]
train = [r for r in rows if r["event"] == "train"]
assert [r["step"] for r in train] == list(range(10, 61, 10)), [r["step"] for r in train]
for r in train:
    assert abs(r["bpc"] - r["loss"] / math.log(2)) < 1e-9 and r["lr"] > 0 and r["tokens_per_s"] > 0, r
# the loss falls: from about ln(V) towards what a character model learns in 60 steps
assert train[-1]["loss"] < train[0]["loss"] - 0.4, (train[0]["loss"], train[-1]["loss"])
vals = [r["val_bpc"] for r in train if "val_bpc" in r]
assert len(vals) == 2 and vals[1] < vals[0] and vals[1] < 4.8, vals
assert rows[-1]["val_bpc"] == vals[1], rows[-1]
cks = [r["step"] for r in rows if r["event"] == "checkpoint"]
assert cks == [20, 40, 60], cks
if fam == "aspan":
    sp = train[-1]["spans"]
    assert len(sp) == 2 and all(0 <= s["mean"] <= s["max"] <= 80 for s in sp), sp
    assert train[-1]["span_loss"] > 0, train[-1]
else:
    fixed = [r for r in rows if r["event"] == "arch_fixed"]
    assert len(fixed) == 1 and fixed[0]["step"] == 40, fixed
    assert all(r["searching"] == (r["step"] <= 40) for r in train), train
    taus = [r["tau"] for r in train if r["searching"]]
    assert all(a > b for a, b in zip(taus, taus[1:])) and abs(taus[-1] - 0.1) < 1e-12, taus
    for r in train:
        assert len(r["arch_weights"]) == 4 and all(abs(sum(w) - 1) < 1e-9 for w in r["arch_weights"]), r
    assert train[-1]["arch"] == fixed[0]["arch"], (train[-1]["arch"], fixed[0]["arch"])
PY
    # the checkpoint: what the server loads, scored by spanserve, near the trainer's validation bpc
    [ -s "$ck" ] && [ -s "$ck.state" ] && ok || bad "$fam: no checkpoint or state"
    ls "$tmp" | grep -q '\.tmp' && bad "$fam: a temporary file was left: $(ls "$tmp")" || ok
    expect 0 "$bin" score --json --model "$ck" "$tmp/val.txt"
    python3 - "$tmp/out" "$tmp/$fam.log" <<'PY' && ok || bad "$fam: score of the checkpoint: $(cat "$tmp/out")"
import json, sys
s = json.load(open(sys.argv[1]))
done = [json.loads(l) for l in open(sys.argv[2])][-1]
assert s["tokens"] == 5999, s
# one stream over the whole text vs the trainer's 8 streams over the same text
assert abs(s["bpc"] - done["val_bpc"]) < 0.15, (s["bpc"], done["val_bpc"])
PY
    expect 0 "$bin" spans --json --model "$ck"
    python3 - "$tmp/out" "$ck" "$fam" "$tmp/$fam.log" <<'PY' && ok || bad "$fam: spans / checkpoint metadata: $(head -c 300 "$tmp/out")"
import json, struct, sys
r = json.load(open(sys.argv[1]))
b = open(sys.argv[2], "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
meta = h["__metadata__"]
cfg, vocab = json.loads(meta["config"]), json.loads(meta["vocab"])
text = open(sys.argv[2].rsplit("/", 1)[0] + "/text.txt").read()
assert vocab == sorted(set(text)) and cfg["vocab_size"] == len(vocab), (len(vocab), cfg)
assert all(v["dtype"] == "F32" for k, v in h.items() if k != "__metadata__")
if sys.argv[3] == "aspan":
    assert r["family"] == "adaptive-span" and len(r["layers"]) == 2, r
    assert "layers.1.attn.attn.adaptive_span._mask.mask_template" in h
else:
    log = [json.loads(l) for l in open(sys.argv[4])]
    fixed = [x for x in log if x["event"] == "arch_fixed"][0]
    assert cfg["arch"] == fixed["arch"], (cfg["arch"], fixed["arch"])
    assert [blk["kind"] for blk in r["blocks"]] == cfg["arch"], r["blocks"]
    assert all(f"blocks.{i}.alpha" in h for i in range(4))
    hist = json.loads(meta["arch_history"])
    assert [row[0] for row in hist] == [10, 20, 30, 40] and len(hist[0]) == 2 + 4, hist[0]
PY

    # the same seed: the same numbers and the same checkpoint; another seed: others
    expect 0 "$bin" train --config "$cfg" --out "$tmp/$fam-again.safetensors" --log "$tmp/$fam-again.log"
    numbers "$tmp/$fam.log" | sed "s|$fam.safetensors|X|" >"$tmp/n1"
    numbers "$tmp/$fam-again.log" | sed "s|$fam-again.safetensors|X|" >"$tmp/n2"
    cmp -s "$tmp/n1" "$tmp/n2" && ok || bad "$fam: the same seed gave other numbers: $(diff "$tmp/n1" "$tmp/n2" | head -c 300)"
    cmp -s "$ck" "$tmp/$fam-again.safetensors" && ok || bad "$fam: the same seed gave another checkpoint"
    expect 0 "$bin" train --config "$cfg" --seed 7 --steps 10 --out "$tmp/$fam-s7.safetensors" --log "$tmp/$fam-s7.log"
    expect 0 "$bin" train --config "$cfg" --seed 7 --steps 10 --out "$tmp/$fam-human.safetensors"
    contains "$tmp/out" "training at step 0 of 10 on cpu"
    grep -Eq '^step +10/10  loss [0-9.]+  bpc [0-9.]+  val_bpc [0-9.]+  lr [0-9.e-]+  [0-9]+ tokens/s  ETA ' "$tmp/out" && ok ||
        bad "$fam: the readable step line: $(cat "$tmp/out")"
    numbers "$tmp/$fam-s7.log" >"$tmp/n7"
    head -n 1 "$tmp/n7" >"$tmp/n3"
    head -n 1 "$tmp/n1" >"$tmp/n4"
    cmp -s "$tmp/n3" "$tmp/n4" && bad "$fam: seed 7 gave the numbers of seed 1" || ok

    # resume: 25 steps (a checkpoint at 20 and at the end), then on to 60 from the state
    rm -f "$tmp/$fam-r.log"
    expect 0 "$bin" train --config "$cfg" --steps 25 --out "$tmp/$fam-r.safetensors" --log "$tmp/$fam-r.log"
    expect 0 "$bin" train --config "$cfg" --resume --out "$tmp/$fam-r.safetensors" --log "$tmp/$fam-r.log"
    contains "$tmp/$fam-r.log" '"event":"resume","step":25'
    # the stopped run's own lines at step 25 (checkpoint, done) are not in the other: compare the rest
    numbers "$tmp/$fam-r.log" | grep -v '"step": 25' | sed "s|$fam-r.safetensors|X|" >"$tmp/n5"
    grep -v '"step": 25' "$tmp/n1" >"$tmp/n6"
    cmp -s "$tmp/n5" "$tmp/n6" && ok || bad "$fam: the resumed run differs: $(diff "$tmp/n5" "$tmp/n6" | head -c 400)"
    cmp -s "$ck" "$tmp/$fam-r.safetensors" && ok || bad "$fam: the resumed run's checkpoint differs"
    # resuming a finished run does no step and says so
    expect 0 "$bin" train --config "$cfg" --resume --json --out "$tmp/$fam-r.safetensors"
    contains "$tmp/out" '"event":"done","step":60'
    # without --json: one readable line an event
    expect 0 "$bin" train --config "$cfg" --resume --out "$tmp/$fam-r.safetensors"
    contains "$tmp/out" "resuming at step 60 of 60 on cpu"
    contains "$tmp/out" "done at step 60 in "
    grep -q '"event"' "$tmp/out" && bad "$fam: JSON on stdout without --json" || ok
    # a changed key that enters the numbers is refused, naming it
    expect 1 "$bin" train --config "$cfg" --resume --steps 80 --seed 3 --out "$tmp/$fam-r.safetensors"
    contains "$tmp/err" "config 'seed' is 3 now but 1"
done

# ------------------------------------------------------------------ the data wraps
# 3,000 characters: 2,700 to train in 8 streams of 337; blocks of 16 start at
# 0, 16, ..., 320, then every stream starts over (and the memories are reset)
head -c 3000 "$tmp/text.txt" >"$tmp/short.txt"
for fam in aspan par; do
    expect 0 "$bin" train --config "$tmp/$fam.json" --data "$tmp/short.txt" --steps 30 --out "$tmp/w-$fam.safetensors" --log "$tmp/w-$fam.log"
    python3 - "$tmp/w-$fam.log" <<'PY' && ok || bad "$fam: positions over a wrap: $(grep data_pos "$tmp/w-$fam.log" | head -c 300)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
pos = [(r["step"], r["data_pos"]) for r in rows]
assert pos == [(10, 160), (20, 320), (30, 144)], pos
PY
    # a resume across the wrap: stopped at 18, on to 30
    expect 0 "$bin" train --config "$tmp/$fam.json" --data "$tmp/short.txt" --steps 18 --out "$tmp/w2-$fam.safetensors" --log "$tmp/w2-$fam.log"
    expect 0 "$bin" train --config "$tmp/$fam.json" --data "$tmp/short.txt" --steps 30 --resume --out "$tmp/w2-$fam.safetensors" --log "$tmp/w2-$fam.log"
    cmp -s "$tmp/w-$fam.safetensors" "$tmp/w2-$fam.safetensors" && ok || bad "$fam: a resume across the wrap gave another checkpoint"
done

# ------------------------------------------------------------------ errors
# badcfg STATUS TEXT JSON: a config that must fail with STATUS, its message containing TEXT
badcfg() {
    printf '%s' "$3" >"$tmp/bad.json"
    expect "$1" "$bin" train --config "$tmp/bad.json"
    contains "$tmp/err" "$2"
}
D="\"data\": \"$tmp/text.txt\", \"out\": \"$tmp/bad.safetensors\""
badcfg 2 "unknown config key 'hidden_sise'" "{\"family\": \"adaptive-span\", $D, \"hidden_sise\": 8}"
badcfg 2 "config 'lr' must be a number" "{\"family\": \"adaptive-span\", $D, \"lr\": \"fast\"}"
badcfg 2 "config 'lr' = -1 is outside (0" "{\"family\": \"adaptive-span\", $D, \"lr\": -1}"
badcfg 2 "config 'nb_heads' must be an integer" "{\"family\": \"adaptive-span\", $D, \"nb_heads\": 2.5}"
badcfg 2 "config 'adapt_span_init' = 1.5 is outside" "{\"family\": \"adaptive-span\", $D, \"adapt_span_init\": 1.5}"
badcfg 2 "config key 'mem_len' belongs to par-transformer-xl, not adaptive-span" "{\"family\": \"adaptive-span\", $D, \"mem_len\": 8}"
badcfg 2 "config key 'attn_span' belongs to adaptive-span" "{\"family\": \"par-transformer-xl\", $D, \"attn_span\": 8}"
badcfg 2 "config 'family' is required" "{$D}"
badcfg 2 "config 'family' = \"gpt\"" "{\"family\": \"gpt\", $D}"
badcfg 2 "config 'hidden_size' = 10 is not a multiple of 'nb_heads' = 4" "{\"family\": \"adaptive-span\", $D, \"hidden_size\": 10}"
badcfg 2 "config 'd_model' = 9 must be even" "{\"family\": \"par-transformer-xl\", $D, \"d_model\": 9}"
badcfg 2 "config 'optim' must be \"adagrad\" or \"adam\"" "{\"family\": \"adaptive-span\", $D, \"optim\": \"sgd\"}"
badcfg 2 "config 'tie_weight' must be true or false" "{\"family\": \"par-transformer-xl\", $D, \"tie_weight\": 1}"
badcfg 2 "config 'data' is required" "{\"family\": \"adaptive-span\", \"out\": \"$tmp/x\"}"
badcfg 2 "config 'out' is required" "{\"family\": \"adaptive-span\", \"data\": \"$tmp/text.txt\"}"
badcfg 2 "not valid JSON" "{\"family\": \"adaptive-span\", "
badcfg 2 "a config must be a JSON object" "[1, 2]"
badcfg 2 "config 'tf32' is true but 'device' is .cpu.: TF32 is the CUDA trainer's" "{\"family\": \"adaptive-span\", $D, \"tf32\": true}"
badcfg 2 "config 'precision' must be .fp32., .tf32. or .bf16." "{\"family\": \"adaptive-span\", $D, \"precision\": \"fp8\"}"
badcfg 2 "config 'tf32' is true but 'precision' is .bf16." "{\"family\": \"adaptive-span\", $D, \"device\": \"cuda\", \"tf32\": true, \"precision\": \"bf16\"}"
badcfg 2 "config 'tf32' is true but 'precision' is .fp32." "{\"family\": \"adaptive-span\", $D, \"device\": \"cuda\", \"precision\": \"fp32\", \"tf32\": true}"
badcfg 1 "No such file" "{\"family\": \"adaptive-span\", \"data\": \"$tmp/none.txt\", \"out\": \"$tmp/x\"}"
badcfg 1 "the training text (54000 characters) is too short for batch_size 4096" "{\"family\": \"adaptive-span\", $D, \"batch_size\": 4096}"
printf 'aaaa' >"$tmp/one.txt"
badcfg 1 "1 distinct characters" "{\"family\": \"adaptive-span\", \"data\": \"$tmp/one.txt\", \"out\": \"$tmp/x\"}"
printf 'ab\377cd' >"$tmp/bin.txt"
badcfg 1 "invalid UTF-8 at byte 2" "{\"family\": \"adaptive-span\", \"data\": \"$tmp/bin.txt\", \"out\": \"$tmp/x\"}"
# the command line
expect 2 "$bin" train --config "$tmp/aspan.json" --device tpu; contains "$tmp/err" "--device must be cpu, cuda or auto"
contains "$tmp/err" "Run 'spanserve train --help' for the options."
expect 2 "$bin" train --config "$tmp/aspan.json" --stpes 3; contains "$tmp/err" "unknown option '--stpes' (did you mean --steps?)"
expect 2 "$bin" train --config "$tmp/aspan.json" --precision bf16 --device cpu; contains "$tmp/err" "bf16 is the CUDA trainer's"
expect 2 "$bin" train --config "$tmp/aspan.json" --precision fp16; contains "$tmp/err" "--precision must be fp32, tf32 or bf16"
# several GPUs and machines: what the command line refuses before anything runs
expect 2 "$bin" train --config "$tmp/aspan.json" --gpus 0; contains "$tmp/err" "--gpus must be an integer from 1 to 16"
expect 2 "$bin" train --config "$tmp/aspan.json" --gpus 2 --device cpu; contains "$tmp/err" "several GPUs are the CUDA trainer's"
expect 2 "$bin" train --config "$tmp/aspan.json" --gpus 3 --device cuda; contains "$tmp/err" "'batch_size' = 8 is not a multiple of 'gpus' = 3"
expect 2 "$bin" train --config "$tmp/aspan.json" --nodes 2; contains "$tmp/err" "--nodes 2 needs --node-rank from 0 to 1"
expect 2 "$bin" train --config "$tmp/aspan.json" --nodes 2 --node-rank 2; contains "$tmp/err" "--nodes 2 needs --node-rank from 0 to 1"
expect 2 "$bin" train --config "$tmp/aspan.json" --node-rank 1; contains "$tmp/err" "--node-rank 1 without --nodes"
expect 2 "$bin" train --config "$tmp/aspan.json" --nodes 2 --node-rank 0 --master node-a; contains "$tmp/err" "--master must be HOST:PORT"
expect 2 "$bin" train --config "$tmp/aspan.json" --nodes 2 --node-rank 1 --device cpu; contains "$tmp/err" "several machines are the CUDA trainer's"
expect 2 "$bin" train --config "$tmp/aspan.json" --precision tf32 --device cpu; contains "$tmp/err" "TF32 is the CUDA trainer's"
# --device cuda: trains on a GPU; else says why not (a build without nvcc: 2, no device: 1)
# the checkpoint's config records the trainer and the device it truly ran on
trainer_of() {
    python3 -c 'import json, struct, sys; f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]
print(json.loads(json.loads(f.read(n))["__metadata__"]["config"])["trainer"])' "$1"
}
[ "$(trainer_of "$tmp/aspan.safetensors")" = "spanserve train (cpu)" ] && ok || bad "trainer: $(trainer_of "$tmp/aspan.safetensors")"
"$bin" train --config "$tmp/aspan.json" --out "$tmp/cuda.safetensors" --steps 10 --device cuda --json >"$tmp/out" 2>"$tmp/err"
rc=$?
case $rc in
0) contains "$tmp/out" '"device":"cuda"'
   [ "$(trainer_of "$tmp/cuda.safetensors")" = "spanserve train (cuda)" ] && ok || bad "trainer: $(trainer_of "$tmp/cuda.safetensors")" ;;
1) contains "$tmp/err" "no CUDA device" ;;
2) contains "$tmp/err" "this build has no CUDA trainer (built without nvcc); train with --device cpu" ;;
*) bad "--device cuda exited $rc: $(head -c 300 "$tmp/err")" ;;
esac
expect 2 "$bin" train; contains "$tmp/err" "--config is required"
expect 2 "$bin" train --config "$tmp/aspan.json" --steps -4; contains "$tmp/err" "--steps must be a non-negative integer"
expect 2 "$bin" train --config "$tmp/nope.json"; contains "$tmp/err" "No such file"
expect 2 "$bin" train --config "$tmp/aspan.json" extra; contains "$tmp/err" "unexpected argument 'extra'"
expect 0 "$bin" train --help; contains "$tmp/out" "usage: spanserve train"
expect 1 "$bin" train --config "$tmp/aspan.json" --out "$tmp/never.safetensors" --resume; contains "$tmp/err" "never.safetensors.state"
expect 1 "$bin" train --config "$tmp/aspan.json" --log "$tmp/no/such/dir.log"; contains "$tmp/err" "log '$tmp/no/such/dir.log'"

# SIGTERM: the step in progress ends, its checkpoint and state are written,
# a "stopped" line is logged, exit status 3; --resume goes on from that step
"$bin" train --config "$tmp/aspan.json" --out "$tmp/stop.safetensors" --steps 1000000 \
    --log "$tmp/stop.log" 2>"$tmp/stop.err" &
pid=$!
for _ in $(seq 1 300); do grep -q '"event":"train"' "$tmp/stop.log" 2>/dev/null && break; sleep 0.1; done
kill -TERM "$pid"; wait "$pid"; rc=$?
[ "$rc" = 3 ] && ok || bad "SIGTERM: exit status $rc, expected 3: $(tail -c 300 "$tmp/stop.err")"
contains "$tmp/stop.err" "stopped by a signal"
python3 - "$tmp/stop.log" "$tmp/stop.safetensors" <<'PY' && ok || bad "SIGTERM: the log: $(tail -n 2 "$tmp/stop.log")"
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ck = [r for r in rows if r["event"] == "checkpoint"]
assert rows[-1]["event"] == "stopped" and rows[-1]["step"] >= 10, rows[-1]
assert ck and ck[-1]["step"] == rows[-1]["step"], ck   # saved at the step it stopped on
assert os.path.getsize(sys.argv[2]) > 0 and os.path.getsize(sys.argv[2] + ".state") > 0
open(sys.argv[1] + ".step", "w").write(str(rows[-1]["step"]))
PY
s=$(cat "$tmp/stop.log.step" 2>/dev/null || echo 0)
expect 0 "$bin" train --config "$tmp/aspan.json" --out "$tmp/stop.safetensors" --steps $((s + 10)) --resume --log "$tmp/stop2.log"
python3 - "$tmp/stop2.log" "$s" <<'PY' && ok || bad "resume after SIGTERM: $(head -n 1 "$tmp/stop2.log") ... $(tail -n 1 "$tmp/stop2.log")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
s = int(sys.argv[2])
assert rows[0]["event"] == "resume" and rows[0]["step"] == s, rows[0]
assert rows[-1]["event"] == "done" and rows[-1]["step"] == s + 10, rows[-1]
PY

echo "test_train.sh: $pass passed, $fail failed"
[ "$fail" = 0 ]
