#!/bin/sh
# test_convert_tf.sh - clients/convert on TensorFlow PAR Transformer-XL
# checkpoints (Jmkernes/PAR-Transformer-XL, ../shared's par-tf). The fixture's
# checkpoint folder converts with every tensor equal to the variable it came
# from (transposes and the Q, V, K reorder undone), its config and its
# SentencePiece model inside; the same variables saved again as the seed's
# train.py saves them (a Keras Adam optimizer's slots, glob_step, an
# iterator, through a CheckpointManager) convert to the same file; --ckpt and
# a path prefix pick a checkpoint; a small model with a Dense output layer
# and a tie in a block's pi; every error a message naming what is wrong, exit
# status 1 and no file. Where bin/spanserve loads the family, the converted
# fixture scores its validation text as the seed did (expected.json).
# Needs numpy and tensorflow (pip install tensorflow-cpu==2.15.1: python3's,
# else build/venv-tf's); says SKIP without them or without the fixture.
bin=${SPANSERVE_BIN:-bin/spanserve}
. tests/fixtures.sh
conv=${SPANSERVE_CONVERT:-clients/convert}
TF_PIP="pip install tensorflow-cpu==2.15.1"
skip() { echo "SKIP test_convert_tf.sh: $*"; echo "test_convert_tf.sh: 0 passed, 0 failed"; exit 0; }
FX=$(shared_path fixtures/par-tf/checkpoint/ckpt-1.index) || skip "no $shared/fixtures/par-tf (set SPANSERVE_SHARED)"
FX=$(cd "$(dirname "$FX")/.." && pwd)
py=python3
has_tf() { "$1" -c 'import numpy, tensorflow' >/dev/null 2>&1; }
if ! has_tf python3; then
    [ -x build/venv-tf/bin/python3 ] && has_tf build/venv-tf/bin/python3 || skip "tensorflow is not installed ($TF_PIP)"
    py=build/venv-tf/bin/python3
fi
export TF_CPP_MIN_LOG_LEVEL=2   # no oneDNN notes from the helper
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_convert_tf.sh: $*"; }
expect() {
    want=$1; shift
    "$@" >"$tmp/out" 2>"$tmp/err"; got=$?
    [ "$got" = "$want" ] && ok || bad "'$*' exited $got, expected $want: $(head -c 400 "$tmp/err")"
}
contains() { grep -q -- "$2" "$1" && ok || bad "$1 lacks '$2': $(head -c 400 "$1")"; }
convert() { "$py" "$conv" "$@"; }
# notf ARGS...: the converter with `import tensorflow` failing in its Python
notf() { "$py" -c 'import runpy, sys; sys.modules["tensorflow"] = None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")' "$conv" "$@"; }
# helper MODE ARGS...: tests/test_convert_tf.py's checks, its counts added to ours
helper() {
    "$py" tests/test_convert_tf.py "$@" >"$tmp/h" 2>&1; rc=$?
    grep '^FAIL' "$tmp/h"
    line=$(grep -E '^test_convert_tf.py: [0-9]+ passed, [0-9]+ failed' "$tmp/h" | tail -n 1)
    if [ -z "$line" ]; then
        bad "tests/test_convert_tf.py $1 exited $rc without its counts: $(tail -c 800 "$tmp/h")"
        return
    fi
    pass=$((pass + $(echo "$line" | sed -E 's/.* ([0-9]+) passed.*/\1/')))
    fail=$((fail + $(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')))
    [ $rc -ne 0 ] && ! grep -q '^FAIL' "$tmp/h" && bad "tests/test_convert_tf.py $1 exited $rc"
}
# nothing_written FILE: a failed conversion left neither FILE nor its temporary
nothing_written() {
    [ ! -e "$1" ] && [ -z "$(ls "$1".tmp.* 2>/dev/null)" ] && ok || bad "a failed conversion left $1"
}
# folder DIR: the fixture's ckpt-1 (linked), its checkpoint file and config.json (copies to edit)
folder() {
    mkdir -p "$1"
    ln -s "$FX/checkpoint/ckpt-1.index" "$FX/checkpoint/ckpt-1.data-00000-of-00001" "$1/"
    cp "$FX/checkpoint/checkpoint" "$FX/checkpoint/config.json" "$1/"
    chmod u+w "$1/checkpoint" "$1/config.json"
}

# ---- the fixture's folder as the seed leaves it: the tokenizer beside it
expect 0 convert "$FX/checkpoint" "$tmp/fx.safetensors"
contains "$tmp/out" "par-transformer-xl-tf, 6 blocks (attn,ffn,attn,ffn,ffn,skip), d_model 128, 4 heads, adaptive softmax, cutoffs \[250, 2500\], proj_dims \[32, 8\], 12000 sentencepiece pieces, from ckpt-1"
contains "$tmp/err" "the tokenizer is $FX/wiki2_12k.model"

# Under the sanitizers (`make asan` sets SPANSERVE_SANITIZED=1) what they
# check is spanserve's side: the fixture converted and scored below. The
# converter's TensorFlow checks (Python and TensorFlow alone, most of this
# test's time) are make test's.
models="fx dense"
if [ "${SPANSERVE_SANITIZED:-}" = 1 ]; then
    models=fx
    echo "note: test_convert_tf.sh under the sanitizers: the fixture converted and scored; the converter's TensorFlow checks run in make test"
else

# ---- the seed's train.py's way of saving: optimizer slots, glob_step, an
# iterator; ckpt-1 the fixture's values, ckpt-2 (the latest) with block 5's
# pi picking the feed-forward branch
helper build "$FX" "$tmp"
if [ -f "$tmp/opt/variables.txt" ]; then
    grep -q '^model/stoch_blks/0/rmha/W_emb/kernel/.OPTIMIZER_SLOT/optimizer/m/' "$tmp/opt/variables.txt" && ok \
        || bad "the rebuilt checkpoint has no optimizer slots: $(head -c 400 "$tmp/opt/variables.txt")"
    nv=$(grep '^model/' "$tmp/opt/variables.txt" | grep -vc '\.OPTIMIZER_SLOT')
    ns=$(grep -c '\.OPTIMIZER_SLOT' "$tmp/opt/variables.txt")
    [ "$nv" -gt 100 ] && [ "$ns" -eq $((2 * nv)) ] && ok \
        || bad "the rebuilt checkpoint has $ns slots for $nv model variables, not Adam's m and v of each"
    for v in glob_step optimizer/iter iterator/.ATTRIBUTES/ITERATOR_STATE save_counter; do
        contains "$tmp/opt/variables.txt" "^$v"
    done
    expect 0 convert "$tmp/opt" "$tmp/opt2.safetensors"
    contains "$tmp/out" "6 blocks (attn,ffn,attn,ffn,ffn,ffn).*from ckpt-2"
    contains "$tmp/err" "the tokenizer is $tmp/opt/wiki2_12k.model"
    expect 0 convert "$tmp/opt" "$tmp/opt1.safetensors" --ckpt ckpt-1
    helper same "$tmp/fx.safetensors" "$tmp/opt1.safetensors"
    expect 0 convert "$tmp/opt/ckpt-1" "$tmp/prefix1.safetensors"
    helper same "$tmp/fx.safetensors" "$tmp/prefix1.safetensors"
    # the seed's repository layout: checkpoints/train/MODEL/ and tokenizer/*.model
    expect 0 convert "$tmp/repo/checkpoints/train/dense" "$tmp/dense.safetensors" --seq-len 20
    contains "$tmp/out" "3 blocks (attn,ffn,skip), d_model 16, 2 heads, one output layer"
    contains "$tmp/err" "the tokenizer is $tmp/repo/tokenizer/wiki2_12k.model"
    # every tensor against its variable, the config, the vocab
    helper check "$tmp/fx.safetensors" "$FX/checkpoint/ckpt-1" "$FX/wiki2_12k.model" 32 \
        "$tmp/opt2.safetensors" "$tmp/opt/ckpt-2" "$FX/wiki2_12k.model" 32 \
        "$tmp/dense.safetensors" "$tmp/repo/checkpoints/train/dense/ckpt-1" "$FX/wiki2_12k.model" 20
else
    bad "tests/test_convert_tf.py build wrote no checkpoints"
fi

# ---- errors: exit 1, a message naming the thing, no file
folder "$tmp/gone"
sed -i 's/ckpt-1/ckpt-7/' "$tmp/gone/checkpoint"
cp "$FX/wiki2_12k.model" "$tmp/gone/"
expect 1 convert "$tmp/gone" "$tmp/e1.safetensors"
contains "$tmp/err" "gone/checkpoint names ckpt-7, which is not there"
nothing_written "$tmp/e1.safetensors"
expect 1 convert "$tmp/opt" "$tmp/e2.safetensors" --ckpt ckpt-9
contains "$tmp/err" "no checkpoint ckpt-9 there.*it holds ckpt-1, ckpt-2"
nothing_written "$tmp/e2.safetensors"
if [ -d "$tmp/nowpos" ]; then
    expect 1 convert "$tmp/nowpos" "$tmp/e3.safetensors"
    contains "$tmp/err" "missing variable 'model/stoch_blks/2/rmha/W_pos/kernel/.ATTRIBUTES/VARIABLE_VALUE'"
    nothing_written "$tmp/e3.safetensors"
fi
folder "$tmp/dmodel"
sed -i 's/"d_model": 128/"d_model": 256/' "$tmp/dmodel/config.json"
cp "$FX/wiki2_12k.model" "$tmp/dmodel/"
expect 1 convert "$tmp/dmodel" "$tmp/e4.safetensors"
contains "$tmp/err" "variable 'model/embed/embeddings/.ATTRIBUTES/VARIABLE_VALUE' has shape \[12000, 128\], but .*config.json says vocab_size 12000, d_model 256"
nothing_written "$tmp/e4.safetensors"
folder "$tmp/notok/ckpt"
expect 1 convert "$tmp/notok/ckpt" "$tmp/e5.safetensors"
contains "$tmp/err" "no SentencePiece model .*pass it as --spm FILE"
nothing_written "$tmp/e5.safetensors"
"$py" tests/test_convert_tf.py shortspm "$FX/wiki2_12k.model" "$tmp/short.model" 11999 || bad "could not write short.model"
expect 1 convert "$FX/checkpoint" "$tmp/e6.safetensors" --spm "$tmp/short.model"
contains "$tmp/err" "short.model has 11999 pieces but .*config.json says vocab_size 12000"
nothing_written "$tmp/e6.safetensors"
expect 1 notf "$FX/checkpoint" "$tmp/e7.safetensors"
contains "$tmp/err" "needs tensorflow, which is not installed.*$TF_PIP"
nothing_written "$tmp/e7.safetensors"
expect 2 convert "$FX/checkpoint" "$tmp/e8.safetensors" --text "$TEXT"
contains "$tmp/err" "--text does not apply to a TensorFlow PAR Transformer-XL checkpoint"
fi   # the converter's TensorFlow checks (not under the sanitizers)

# ---- served: the converted fixture scores its validation text (the last
# 10% of tiny_shakespeare by characters) as the seed did, where bin/spanserve
# knows the family
if [ -x "$bin" ] && "$bin" spans --model "$tmp/fx.safetensors" 2>/dev/null | grep -q '^par-transformer-xl-tf'; then
    "$py" - "$(ref_path data/tiny_shakespeare.txt)" "$tmp/val.txt" <<'EOF' || bad "could not write the validation text"
import sys
t = open(sys.argv[1], encoding="utf-8").read()
open(sys.argv[2], "w", encoding="utf-8").write(t[int(len(t) * 0.9):])
EOF
    for m in $models; do
        "$bin" score --json --model "$tmp/$m.safetensors" "$tmp/val.txt" >"$tmp/score_$m" 2>"$tmp/err" \
            || bad "spanserve score $m.safetensors: $(head -c 400 "$tmp/err")"
    done
    # the fixture as the seed scored it; the dense model (where converted) the same tokens, a finite nll
    "$py" - "$FX/expected.json" $(for m in $models; do echo "$tmp/score_$m"; done) <<'EOF' && ok || bad "spanserve's scores: $(for m in $models; do cat "$tmp/score_$m"; done)"
import json, math, sys
e = json.load(open(sys.argv[1]))
fx, others = json.load(open(sys.argv[2])), [json.load(open(p)) for p in sys.argv[3:]]
sys.exit(0 if fx["tokens"] == e["val_tokens_scored"] and all(o["tokens"] == fx["tokens"] and math.isfinite(o["nll"])
                                                           for o in others)
         and abs(fx["nll"] - e["val_nll_full_eval"]) <= 1e-4 * e["val_nll_full_eval"] else 1)
EOF
elif [ ! -x "$bin" ]; then
    echo "SKIP test_convert_tf.sh spanserve: no $bin (make builds it)"
else
    echo "SKIP test_convert_tf.sh spanserve: $bin does not load family par-transformer-xl-tf (spans --model says: $("$bin" spans --model "$tmp/fx.safetensors" 2>&1 | head -n 1))"
fi

echo "test_convert_tf.sh: $pass passed, $fail failed"
[ "$fail" = 0 ]
