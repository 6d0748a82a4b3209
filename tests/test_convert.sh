#!/bin/sh
# test_convert.sh - clients/convert: the fixtures' weights saved as the
# reference trainers save them (an adaptive-span trainer checkpoint with
# DataParallel's `module.` prefixes; a Transformer-XL state_dict and a whole
# pickled MemTransformerLM), converted back, must score a text exactly as the
# original checkpoints do; vocabularies rebuilt from text as the references
# build them; every error case a clear message and exit status 1. The GPTs
# (../shared's nanogpt-char: nanoGPT's own ckpt.pt and meta.pkl; gpt-aspan:
# its tensors saved as gpt.py's users save them) convert to the fixtures'
# model.safetensors bit for bit.
# Needs numpy; torch (the GPU machine has it) to write the files, so those
# parts are skipped where it is missing. The converter itself reads them
# without torch too (checked with torch blocked); nanogpt-char's ckpt.pt
# needs no writing, so it is converted with or without torch.
bin=${SPANSERVE_BIN:-bin/spanserve}
. tests/fixtures.sh   # $A, $P, $TEXT
conv=${SPANSERVE_CONVERT:-clients/convert}
if ! python3 -c 'import numpy' >/dev/null 2>&1; then
    echo "SKIP test_convert.sh: numpy is not installed (clients/convert needs it: pip install numpy)"
    echo "test_convert.sh: 0 passed, 0 failed"
    exit 0
fi
have_torch=1
python3 -c 'import torch' >/dev/null 2>&1 || have_torch=0
# Under the sanitizers (`make asan` sets SPANSERVE_SANITIZED=1) what they
# check is spanserve's side, reading and scoring what the converter wrote:
# there the converter reads without torch (its own reader, whose files make
# test checks are byte for byte torch's; torch's import was most of this
# test's time) and the texts scored are 2,000 characters, not 20,000.
ntext=20000
if [ "${SPANSERVE_SANITIZED:-}" = 1 ]; then
    export SPANSERVE_CONVERT_NO_TORCH=1
    ntext=2000
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_convert.sh: $*"; }
expect() {
    want=$1; shift
    "$@" >"$tmp/out" 2>"$tmp/err"; got=$?
    [ "$got" = "$want" ] && ok || bad "'$*' exited $got, expected $want: $(head -c 400 "$tmp/err")"
}
contains() { grep -q -- "$2" "$1" && ok || bad "$1 lacks '$2': $(head -c 400 "$1")"; }
# same_bpc ORIGINAL CONVERTED: spanserve score --json gives the same bpc (1e-6)
same_bpc() {
    "$bin" score --json --model "$1" "$tmp/text.txt" >"$tmp/s1" 2>"$tmp/e1" || { bad "score $1: $(cat "$tmp/e1")"; return; }
    "$bin" score --json --model "$2" "$tmp/text.txt" >"$tmp/s2" 2>"$tmp/e2" || { bad "score $2: $(cat "$tmp/e2")"; return; }
    python3 - "$tmp/s1" "$tmp/s2" <<'EOF' && ok || bad "bpc of $2 differs from $1: $(cat "$tmp/s1") vs $(cat "$tmp/s2")"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
sys.exit(0 if a["tokens"] == b["tokens"] and abs(a["bpc"] - b["bpc"]) <= 1e-6 else 1)
EOF
}
# meta FILE PYEXPR: PYEXPR over c (config) and v (vocab) and names is true
meta() {
    python3 - "$1" "$2" <<'EOF' && ok || bad "$1: not ($2)"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
m = h.pop("__metadata__")
c, v, names = json.loads(m["config"]), json.loads(m["vocab"]), set(h)
sys.exit(0 if eval(sys.argv[2]) else 1)
EOF
}
# same_st FIXTURE OUT: the same tensors (names, dtypes, shapes, bytes), config and vocabulary (as JSON)
same_st() {
    python3 - "$1" "$2" <<'EOF' && ok || bad "$2 differs from $1"
import json, struct, sys
def read(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); m = h.pop("__metadata__")
    return ({k: (x["dtype"], x["shape"], b[8 + n + x["data_offsets"][0]:8 + n + x["data_offsets"][1]])
             for k, x in h.items()}, json.loads(m["config"]), json.loads(m["vocab"]))
(ta, ca, va), (tb, cb, vb) = read(sys.argv[1]), read(sys.argv[2])
bad = sorted(k for k in set(ta) | set(tb) if ta.get(k) != tb.get(k))
for k in bad[:5]: print("tensor %s differs or is missing" % k)
if ca != cb: print("config %r vs %r" % (ca, cb))
if va != vb: print("vocab differs")
sys.exit(1 if bad or ca != cb or va != vb or not ta else 0)
EOF
}
# notorch ARGS...: run a Python script with `import torch` failing in it
notorch() { python3 -c 'import runpy, sys; sys.modules["torch"] = None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")' "$@"; }
same_file() { cmp -s "$1" "$2" && ok || bad "$2 differs from $1 (read with torch)"; }
# nothing_written FILE: a failed conversion left no FILE
nothing_written() { [ ! -e "$1" ] && ok || bad "a failed conversion left $1"; }

# ---- nanoGPT: nanogpt-char's ckpt.pt as train.py wrote it (`_orig_mod.`
# prefixes) with prepare.py's meta.pkl, read with torch and with torch
# blocked; the meta.pkl found beside it, in nanoGPT's layout
# (data/<dataset>/meta.pkl above out-*/ckpt.pt, or under the current
# directory), given with --meta, or the vocabulary rebuilt from the text
if N=$(shared_path fixtures/nanogpt-char/ckpt.pt); then
ND=$(dirname "$N")
convabs=$(cd "$(dirname "$conv")" && pwd)/$(basename "$conv")
expect 0 "$conv" "$N" "$tmp/nano.safetensors"
contains "$tmp/out" "nanogpt, 4 layers, n_embd 128, 4 heads, block_size 128, 65 characters"
contains "$tmp/err" "the vocabulary is $ND/meta.pkl"
same_st "$ND/model.safetensors" "$tmp/nano.safetensors"
expect 0 notorch "$conv" "$N" "$tmp/nt_nano.safetensors"
same_st "$ND/model.safetensors" "$tmp/nt_nano.safetensors"
# and served: the converted file scores as the fixture's (windows of block_size)
head -c 6000 "$ND/../../data/tiny_shakespeare.txt" >"$tmp/text.txt"
same_bpc "$ND/model.safetensors" "$tmp/nt_nano.safetensors"
mkdir -p "$tmp/nanogpt/out-shakespeare-char" "$tmp/nanogpt/data/shakespeare_char" "$tmp/nometa"
cp "$N" "$tmp/nanogpt/out-shakespeare-char/ckpt.pt"; cp "$ND/meta.pkl" "$tmp/nanogpt/data/shakespeare_char/"
cp "$N" "$tmp/nometa/ckpt.pt"
expect 0 notorch "$conv" "$tmp/nanogpt/out-shakespeare-char/ckpt.pt" "$tmp/nano_layout.safetensors"
contains "$tmp/err" "the vocabulary is $tmp/nanogpt/data/shakespeare_char/meta.pkl"
same_st "$ND/model.safetensors" "$tmp/nano_layout.safetensors"
(cd "$tmp/nanogpt" && python3 "$convabs" "$tmp/nometa/ckpt.pt" "$tmp/nano_cwd.safetensors") >"$tmp/out" 2>"$tmp/err" \
    && ok || bad "convert from nanoGPT's directory: $(cat "$tmp/err")"
contains "$tmp/err" "the vocabulary is data/shakespeare_char/meta.pkl"
same_st "$ND/model.safetensors" "$tmp/nano_cwd.safetensors"
expect 0 "$conv" "$tmp/nometa/ckpt.pt" "$tmp/nano_meta.safetensors" --meta "$ND/meta.pkl"
same_st "$ND/model.safetensors" "$tmp/nano_meta.safetensors"
expect 0 notorch "$conv" "$tmp/nometa/ckpt.pt" "$tmp/nano_text.safetensors" --text "$TEXT"
same_st "$ND/model.safetensors" "$tmp/nano_text.safetensors"
# meta.pkl files that do not fit: another size, a vocab_size its itos
# contradicts, a symbol of two characters
python3 - "$ND/meta.pkl" "$tmp" <<'EOF' || bad "could not write the meta.pkl files"
import pickle, sys
meta, tmp = sys.argv[1:3]
m = pickle.load(open(meta, "rb"))
itos = {i: c for i, c in m["itos"].items() if i < 64}
pickle.dump({"vocab_size": 64, "itos": itos, "stoi": {c: i for i, c in itos.items()}}, open(tmp + "/meta64.pkl", "wb"))
pickle.dump(dict(m, vocab_size=66), open(tmp + "/meta_size.pkl", "wb"))
w = dict(m["itos"]); w[13] = "AB"
pickle.dump(dict(m, itos=w, stoi={c: i for i, c in w.items()}), open(tmp + "/meta_word.pkl", "wb"))
EOF
printf 'abc\n' >"$tmp/abc.txt"
# errors: each exit 1 with its message, nothing written (most read with torch
# blocked: the converter's own reader, without torch's 2 s import)
expect 1 notorch "$conv" "$tmp/nometa/ckpt.pt" "$tmp/gx.safetensors"
contains "$tmp/err" "only character-level nanoGPT (a meta.pkl with itos"
contains "$tmp/err" "GPT-2 BPE vocabularies (nanoGPT's without a meta.pkl) are not"
expect 1 notorch "$conv" "$tmp/nometa/ckpt.pt" "$tmp/gx.safetensors" --meta "$tmp/meta64.pkl"
contains "$tmp/err" "itos lists 64 characters but the model has 65 tokens"
expect 1 notorch "$conv" "$tmp/nometa/ckpt.pt" "$tmp/gx.safetensors" --meta "$tmp/meta_size.pkl"
contains "$tmp/err" "vocab_size is 66 but itos lists 65 characters"
expect 1 notorch "$conv" "$tmp/nometa/ckpt.pt" "$tmp/gx.safetensors" --meta "$tmp/meta_word.pkl"
contains "$tmp/err" "itos\[13\] is 'AB', not one character"
expect 1 notorch "$conv" "$tmp/nometa/ckpt.pt" "$tmp/gx.safetensors" --text "$tmp/abc.txt"
contains "$tmp/err" "has 4 distinct characters but the model has 65 tokens"
nothing_written "$tmp/gx.safetensors"
expect 2 notorch "$conv" "$N" "$tmp/gx.safetensors" --block-sz 64 --config "$tmp/abc.txt"
contains "$tmp/err" "do not apply to a nanoGPT checkpoint"
if [ "$have_torch" = 1 ]; then
    # an older nanoGPT's checkpoint (no torch.compile prefixes, the causal
    # masks attn.bias, the optimizer's state); a shape model_args contradict;
    # lm_head untied; the state_dict alone
    mkdir -p "$tmp/nano"; cp "$ND/meta.pkl" "$tmp/nano/"
    python3 - "$N" "$tmp/nano" <<'EOF' || bad "could not write the nanoGPT .pt files"
import sys, torch
N, d = sys.argv[1:3]
ck = torch.load(N, map_location="cpu")
sd = {k[len("_orig_mod."):]: v for k, v in ck["model"].items()}
old = dict(sd)
for l in range(4):
    old["transformer.h.%d.attn.bias" % l] = torch.tril(torch.ones(128, 128)).view(1, 1, 128, 128)
opt = {"state": {0: {"step": torch.tensor(1500.0), "exp_avg": torch.zeros(65, 128)}}, "param_groups": [{"lr": 1e-3}]}
torch.save(dict(ck, model=old, optimizer=opt), d + "/old.pt")
torch.save(dict(ck, model_args=dict(ck["model_args"], block_size=256)), d + "/shape.pt")
torch.save(dict(ck, model=dict(sd, **{"lm_head.weight": sd["lm_head.weight"] * 0.5})), d + "/untied.pt")
torch.save(dict(ck, model_args=dict(ck["model_args"], bias=False)), d + "/nobias.pt")
torch.save(sd, d + "/sd.pt")
EOF
    expect 0 "$conv" "$tmp/nano/old.pt" "$tmp/nano_old.safetensors"
    same_st "$ND/model.safetensors" "$tmp/nano_old.safetensors"
    expect 0 notorch "$conv" "$tmp/nano/old.pt" "$tmp/nt_nano_old.safetensors"
    same_file "$tmp/nano_old.safetensors" "$tmp/nt_nano_old.safetensors"
    expect 1 notorch "$conv" "$tmp/nano/shape.pt" "$tmp/gx.safetensors"
    contains "$tmp/err" "tensor 'transformer.wpe.weight' has shape \[128, 128\], expected \[256, 128\] from model_args"
    expect 1 notorch "$conv" "$tmp/nano/shape.pt" "$tmp/gx.safetensors"
    contains "$tmp/err" "tensor 'transformer.wpe.weight' has shape \[128, 128\], expected \[256, 128\] from model_args"
    expect 1 notorch "$conv" "$tmp/nano/untied.pt" "$tmp/gx.safetensors"
    contains "$tmp/err" "'lm_head.weight' differs from 'transformer.wte.weight': nanoGPT ties them"
    expect 1 notorch "$conv" "$tmp/nano/nobias.pt" "$tmp/gx.safetensors"
    contains "$tmp/err" "unexpected tensor 'transformer.h.0.ln_1.bias': not part of nanoGPT's GPT with bias False"
    expect 1 notorch "$conv" "$tmp/nano/sd.pt" "$tmp/gx.safetensors" --vocab "$tmp/abc.txt"
    contains "$tmp/err" "a bare state_dict: convert the ckpt.pt"
    nothing_written "$tmp/gx.safetensors"
else
    echo "SKIP test_convert.sh nanoGPT variants: torch is not installed (it writes them)"
fi
else
    echo "SKIP test_convert.sh nanoGPT: no $shared/fixtures/nanogpt-char (set SPANSERVE_SHARED)"
fi

# ---- gpt-aspan: the fixture's tensors saved as gpt.py's users save them
# (torch.save(model.state_dict())), the project's config.json beside the .pt
# or given with --config, the vocabulary rebuilt from the text as data.py
# builds it; with torch blocked the same file byte for byte
if G=$(shared_path fixtures/gpt-aspan/model.safetensors) && [ "$have_torch" = 1 ]; then
mkdir -p "$tmp/ga" "$tmp/ga_nocfg" "$tmp/ga_bad"
python3 - "$G" "$tmp" <<'EOF' || bad "could not write the gpt.py .pt files"
import collections, json, struct, sys
import numpy as np, torch
G, tmp = sys.argv[1:3]
b = open(G, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); m = h.pop("__metadata__")
c, v = json.loads(m["config"]), json.loads(m["vocab"])
sd = collections.OrderedDict()
for k in sorted(h):
    s, e = h[k]["data_offsets"]
    sd[k] = torch.from_numpy(np.frombuffer(b[8 + n + s:8 + n + e], dtype="<f4").reshape(h[k]["shape"]).copy())
# the seed's config.json: its keys, without what the converter adds
cfg = collections.OrderedDict((k, x) for k, x in c.items() if k not in ("family", "vocab_size", "max_size", "ramp_size"))
json.dump(cfg, open(tmp + "/ga/config.json", "w"))
json.dump(v, open(tmp + "/ga_vocab.json", "w"))
torch.save(sd, tmp + "/ga/model.pt")
torch.save(sd, tmp + "/ga_nocfg/model.pt")
# enable_adaptive_span=False: no span modules
torch.save(collections.OrderedDict((k, x) for k, x in sd.items() if ".adaptive_span." not in k), tmp + "/ga_nospan.pt")
def variant(name, drop=(), **put):
    u = collections.OrderedDict((k, x) for k, x in sd.items() if k not in drop)
    u.update(put)
    torch.save(u, tmp + "/ga_bad/" + name + ".pt")
variant("mixed", drop=("blocks.2.sa.heads.1.adaptive_span.current_val", "blocks.2.sa.heads.1.adaptive_span.mask_template"))
variant("cv", **{"blocks.1.sa.heads.3.adaptive_span.current_val": torch.full((1, 1, 1), 1.5)})
variant("tpl", **{"blocks.0.sa.heads.0.adaptive_span.mask_template": torch.linspace(0, 127, 128)})
variant("shape", **{"blocks.3.ff.net.0.weight": torch.zeros(256, 128)})
json.dump(dict(cfg, n_head=8), open(tmp + "/ga_bad/config_heads.json", "w"))
EOF
expect 0 "$conv" "$tmp/ga/model.pt" "$tmp/ga.safetensors" --text "$TEXT"
contains "$tmp/out" "gpt-adaptive-span, 4 layers, n_embd 128, 4 heads, block_size 128, adaptive spans, 65 characters"
same_st "$G" "$tmp/ga.safetensors"
expect 0 "$conv" "$tmp/ga_nocfg/model.pt" "$tmp/ga_cfg.safetensors" --config "$tmp/ga/config.json" --vocab "$tmp/ga_vocab.json"
same_st "$G" "$tmp/ga_cfg.safetensors"
expect 0 notorch "$conv" "$tmp/ga/model.pt" "$tmp/nt_ga.safetensors" --text "$TEXT"
same_file "$tmp/ga.safetensors" "$tmp/nt_ga.safetensors"
same_st "$G" "$tmp/nt_ga.safetensors"
# without spans: the same family, no span tensors, the rest the fixture's
expect 0 notorch "$conv" "$tmp/ga_nospan.pt" "$tmp/ga_nospan.safetensors" --config "$tmp/ga/config.json" --text "$TEXT"
contains "$tmp/out" "no adaptive spans"
meta "$tmp/ga_nospan.safetensors" 'c["family"] == "gpt-adaptive-span" and c["max_size"] == 128 and not any(".adaptive_span." in n for n in names) and "blocks.3.sa.heads.3.tril" in names and len(names) == 142 - 32'
# errors: each exit 1 with its message, nothing written
expect 1 notorch "$conv" "$tmp/ga_nocfg/model.pt" "$tmp/gx.safetensors" --text "$TEXT"
contains "$tmp/err" "does not record the model's shape and there is no config.json beside it: pass --config FILE"
expect 1 notorch "$conv" "$tmp/ga/model.pt" "$tmp/gx.safetensors" --text "$tmp/abc.txt"
contains "$tmp/err" "has 4 distinct characters but the model has 65 tokens"
expect 1 notorch "$conv" "$tmp/ga_bad/mixed.pt" "$tmp/gx.safetensors" --config "$tmp/ga/config.json" --text "$TEXT"
contains "$tmp/err" "'blocks.2.sa.heads.1.adaptive_span.current_val' is not: gpt.py builds every head with an adaptive span or none"
expect 1 notorch "$conv" "$tmp/ga_bad/cv.pt" "$tmp/gx.safetensors" --config "$tmp/ga/config.json" --text "$TEXT"
contains "$tmp/err" "'blocks.1.sa.heads.3.adaptive_span.current_val' is 1.5: outside \[0, 1\]"
expect 1 notorch "$conv" "$tmp/ga_bad/tpl.pt" "$tmp/gx.safetensors" --config "$tmp/ga/config.json" --text "$TEXT"
contains "$tmp/err" "'blocks.0.sa.heads.0.adaptive_span.mask_template' is not linspace(1-block_size, 0, block_size)"
expect 1 notorch "$conv" "$tmp/ga_bad/shape.pt" "$tmp/gx.safetensors" --config "$tmp/ga/config.json" --text "$TEXT"
contains "$tmp/err" "'blocks.3.ff.net.0.weight' has shape \[256, 128\], expected \[512, 128\] from $tmp/ga/config.json"
expect 1 notorch "$conv" "$tmp/ga/model.pt" "$tmp/gx.safetensors" --config "$tmp/ga_bad/config_heads.json" --text "$TEXT"
contains "$tmp/err" "config_heads.json says n_head 8 but block 0 has 4 heads"
nothing_written "$tmp/gx.safetensors"
expect 2 notorch "$conv" "$tmp/ga/model.pt" "$tmp/gx.safetensors"
contains "$tmp/err" "give the vocabulary: either --text FILE (the text data.py read) or --vocab FILE"
elif [ "$have_torch" = 1 ]; then
    echo "SKIP test_convert.sh gpt-aspan: no $shared/fixtures/gpt-aspan (set SPANSERVE_SHARED)"
else
    echo "SKIP test_convert.sh gpt-aspan: torch is not installed (it writes the .pt files)"
fi

# the rest writes every file it converts with torch
if [ "$have_torch" = 0 ]; then
    echo "SKIP test_convert.sh reference layouts: torch is not installed (the GPU machine has it)"
    echo "test_convert.sh: $pass passed, $fail failed"
    [ "$fail" = 0 ]
    exit
fi

# 20000 characters of the validation text (2000 under the sanitizers)
python3 -c "import sys; t=open(sys.argv[1]).read(); sys.stdout.write(t[int(0.9*len(t)):][:int(sys.argv[2])])" \
    "$TEXT" "$ntext" >"$tmp/text.txt"

# ---- the reference layouts, written from the fixtures' weights
python3 - "$A" "$P" "$tmp" "$conv" <<'EOF' || { bad "could not write the .pt files"; echo "test_convert.sh: $pass passed, $fail failed"; exit 1; }
import collections, importlib.machinery, importlib.util, json, struct, sys, types
import numpy as np, torch
A, P, tmp, conv = sys.argv[1:5]
ld = importlib.machinery.SourceFileLoader("convert_mod", conv)
spec = importlib.util.spec_from_loader("convert_mod", ld)
cm = importlib.util.module_from_spec(spec); ld.exec_module(cm)

def read_st(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); m = h.pop("__metadata__")
    t = collections.OrderedDict()
    for k in sorted(h):
        s, e = h[k]["data_offsets"]
        t[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype="<f4").reshape(h[k]["shape"]).copy()
    return t, json.loads(m["config"]), json.loads(m["vocab"])

T = lambda a: torch.from_numpy(np.array(a, dtype=np.float32))

# a stand-in for the trainer's own classes, pickled under their module names
# that the converter cannot import
for modname in ("aspan_trainer_utils", "mem_transformer"):
    sys.modules[modname] = types.ModuleType(modname)
class Logger(object):
    def __init__(self): self.logs = {"train_loss": [1.0, 0.9]}
Logger.__module__ = "aspan_trainer_utils"; sys.modules["aspan_trainer_utils"].Logger = Logger

# adaptive-span: trainer checkpoint with module. prefixes
at, ac, av = read_st(A)
json.dump(av, open(tmp + "/vocab.json", "w"))
sd = collections.OrderedDict(("module." + k, T(v)) for k, v in at.items())
opt = {"state": {}, "param_groups": [{"lr": 0.07}]}
torch.save({"nb_iter": 3000, "model": sd, "optimizer": opt, "logger": Logger(), "scheduler": {"last_epoch": 3000}},
           tmp + "/aspan.pt")
# a bare state_dict without mask_template buffers (derived)
sd2 = collections.OrderedDict((k, T(v)) for k, v in at.items() if not k.endswith("mask_template"))
torch.save(sd2, tmp + "/aspan_sd.pt")
sd3 = collections.OrderedDict((k, v) for k, v in sd2.items() if k != "layers.1.ff.fc2.bias")
torch.save({"nb_iter": 1, "model": sd3}, tmp + "/aspan_missing.pt")

# PAR: the reference for a plain Transformer-XL: par-small's blocks with
# arch attn,ffn,...: TXL layer i = block 2i's attention, block 2i+1's ff
pt, pc, pv = read_st(P)
nb = pc["n_blocks"]; L = nb // 2
pc2 = dict(pc); pc2["arch"] = ["attn", "ffn"] * L
cm.write_safetensors(tmp + "/par_ref.safetensors", pt, pc2, pv)
emb = torch.nn.Parameter(T(pt["emb.weight"]))
txl = collections.OrderedDict()
txl["pos_emb.inv_freq"] = 1 / (10000 ** (torch.arange(0.0, pc["d_model"], 2.0) / pc["d_model"]))
txl["word_emb.emb_layers.0.weight"] = emb
txl["r_w_bias"] = T(pt["r_w_bias"]); txl["r_r_bias"] = T(pt["r_r_bias"])
for i in range(L):
    for k in ("qkv_net.weight", "r_net.weight", "o_net.weight", "layer_norm.weight", "layer_norm.bias"):
        txl["layers.%d.dec_attn.%s" % (i, k)] = T(pt["blocks.%d.attn.%s" % (2 * i, k)])
    for k in ("CoreNet.0.weight", "CoreNet.0.bias", "CoreNet.3.weight", "CoreNet.3.bias",
              "layer_norm.weight", "layer_norm.bias"):
        txl["layers.%d.pos_ff.%s" % (i, k)] = T(pt["blocks.%d.ff.%s" % (2 * i + 1, k)])
txl["crit.out_layers.0.weight"] = emb  # tied: the same tensor
txl["crit.out_layers.0.bias"] = T(pt["out.bias"])
torch.save(collections.OrderedDict((k, v.data if isinstance(v, torch.nn.Parameter) else v) for k, v in txl.items()),
           tmp + "/txl_sd.pt")
# untied: a separate output weight
u = collections.OrderedDict(txl); u["crit.out_layers.0.weight"] = T(pt["emb.weight"] * 0.5)
torch.save(collections.OrderedDict((k, v.data) for k, v in u.items()), tmp + "/txl_untied.pt")
pu = dict(pt); pu["out.weight"] = pt["emb.weight"] * np.float32(0.5); pc3 = dict(pc2); pc3["tie_weight"] = False
cm.write_safetensors(tmp + "/par_untied_ref.safetensors", pu, pc3, pv)
# adaptive softmax (a second output cluster)
w = collections.OrderedDict((k, v.data) for k, v in txl.items())
w["crit.out_layers.1.weight"] = torch.zeros(4, 8); w["crit.cluster_weight"] = torch.zeros(1, pc["d_model"])
torch.save(w, tmp + "/txl_adaptive.pt")

# the whole pickled MemTransformerLM (its code not importable at load time)
class Node(torch.nn.Module):
    pass
Node.__module__ = "mem_transformer"; sys.modules["mem_transformer"].Node = Node
class MemTransformerLM(torch.nn.Module):
    pass
MemTransformerLM.__module__ = "mem_transformer"; sys.modules["mem_transformer"].MemTransformerLM = MemTransformerLM
m = MemTransformerLM()
for k, v in dict(n_token=len(pv), n_layer=L, d_model=pc["d_model"], n_head=pc["n_head"], d_head=pc["d_head"],
                 d_embed=pc["d_model"], mem_len=pc["mem_len"], tgt_len=pc["tgt_len"], ext_len=0,
                 attn_type=0, same_length=False, clamp_len=-1).items():
    setattr(m, k, v)
def put(root, name, val):
    parts = name.split(".")
    for p in parts[:-1]:
        if p not in root._modules:
            root.add_module(p, Node())
        root = root._modules[p]
    if parts[-1] == "inv_freq":
        root.register_buffer("inv_freq", val)
    else:
        root.register_parameter(parts[-1], val if isinstance(val, torch.nn.Parameter) else torch.nn.Parameter(val))
for k, v in txl.items():
    put(m, k, v)
for i in range(L):
    m.layers._modules[str(i)].dec_attn.pre_lnorm = False
assert m.crit.out_layers._modules["0"].weight is m.word_emb.emb_layers._modules["0"].weight
torch.save(m, tmp + "/txl_model.pt")
torch.save({"foo": torch.zeros(3), "bar.weight": torch.ones(2, 2)}, tmp + "/other.pt")

# tiny models for the vocabulary from text
torch.manual_seed(0)
def tiny_aspan(V, path):
    H, K, S, I = 8, 2, 16, 16
    s = {"in_emb.weight": torch.randn(V, H), "key_pe": torch.randn(1, H // K, S) * 0.1,
         "out_emb.weight": torch.randn(V, H), "out_emb.bias": torch.zeros(V)}
    for x in ("query", "key", "val", "out"):
        s["layers.0.attn.proj_%s.weight" % x] = torch.randn(H, H) * 0.3
    s["layers.0.attn.attn.adaptive_span._mask.current_val"] = torch.full((K, 1, 1), 0.5)
    s["layers.0.attn.attn.adaptive_span._mask.mask_template"] = torch.linspace(1 - S, 0, steps=S)
    for n in ("norm1", "norm2"):
        s["layers.0.%s.weight" % n] = torch.ones(H); s["layers.0.%s.bias" % n] = torch.zeros(H)
    s["layers.0.ff.fc1.weight"] = torch.randn(I, H) * 0.3; s["layers.0.ff.fc1.bias"] = torch.zeros(I)
    s["layers.0.ff.fc2.weight"] = torch.randn(H, I) * 0.3; s["layers.0.ff.fc2.bias"] = torch.zeros(H)
    torch.save({"nb_iter": 1, "model": {"module." + k: v for k, v in s.items()}, "optimizer": {}}, path)
tiny_aspan(5, tmp + "/tiny_aspan5.pt")
tiny_aspan(3, tmp + "/tiny_aspan3.pt")
def tiny_txl(V, path):
    D, nh, dh, I = 8, 2, 4, 16
    s = {"word_emb.emb_layers.0.weight": torch.randn(V, D), "r_w_bias": torch.randn(nh, dh) * 0.1,
         "r_r_bias": torch.randn(nh, dh) * 0.1, "crit.out_layers.0.bias": torch.zeros(V),
         "layers.0.dec_attn.qkv_net.weight": torch.randn(3 * nh * dh, D) * 0.3,
         "layers.0.dec_attn.r_net.weight": torch.randn(nh * dh, D) * 0.3,
         "layers.0.dec_attn.o_net.weight": torch.randn(D, nh * dh) * 0.3,
         "layers.0.dec_attn.layer_norm.weight": torch.ones(D), "layers.0.dec_attn.layer_norm.bias": torch.zeros(D),
         "layers.0.pos_ff.CoreNet.0.weight": torch.randn(I, D) * 0.3, "layers.0.pos_ff.CoreNet.0.bias": torch.zeros(I),
         "layers.0.pos_ff.CoreNet.3.weight": torch.randn(D, I) * 0.3, "layers.0.pos_ff.CoreNet.3.bias": torch.zeros(D),
         "layers.0.pos_ff.layer_norm.weight": torch.ones(D), "layers.0.pos_ff.layer_norm.bias": torch.zeros(D)}
    torch.save(s, path)
tiny_txl(3, tmp + "/tiny_txl3.pt")
EOF
printf 'not a checkpoint\n' >"$tmp/text.pt"
# adaptive-span style char data: space-separated symbols, one line per line
printf 'a b c\nb a d\n' >"$tmp/train5.txt"
printf 'hello world\n' >"$tmp/words.txt"
# transformer-xl char data: counted over train/valid/test, lower-cased, by frequency
printf 'A b b\n' >"$tmp/txl_train.txt"; printf 'c c\n' >"$tmp/txl_valid.txt"; printf 'c\n' >"$tmp/txl_test.txt"

# ---- adaptive-span: the trainer checkpoint converts back to the fixture
expect 0 "$conv" "$tmp/aspan.pt" "$tmp/aspan.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32
contains "$tmp/out" "adaptive-span"
meta "$tmp/aspan.safetensors" 'c["family"] == "adaptive-span" and c["nb_layers"] == 4 and c["nb_heads"] == 4 and c["attn_span"] == 512 and c["block_size"] == 64 and not any(n.startswith("module.") for n in names)'
same_bpc "$A" "$tmp/aspan.safetensors"
# a bare state_dict without mask_template, flags agreeing with the tensors
expect 0 "$conv" "$tmp/aspan_sd.pt" "$tmp/aspan_sd.safetensors" --vocab "$tmp/vocab.json" \
    --nlayers 4 --hid-sz 128 --inner-hid-sz 512 --nheads 4 --attn-span 512 --block-sz 64 --adapt-span-ramp 32
same_bpc "$A" "$tmp/aspan_sd.safetensors"

# ---- Transformer-XL: state_dict and whole model -> PAR attn,ffn,...
expect 0 "$conv" "$tmp/txl_sd.pt" "$tmp/txl_sd.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48
contains "$tmp/out" "par-transformer-xl"
meta "$tmp/txl_sd.safetensors" 'c["family"] == "par-transformer-xl" and c["arch"] == ["attn", "ffn"] * 4 and c["tie_weight"] is True and "out.weight" not in names and "blocks.0.attn.qkv_net.weight" in names and "blocks.1.ff.CoreNet.0.weight" in names and "blocks.1.attn.qkv_net.weight" not in names'
same_bpc "$tmp/par_ref.safetensors" "$tmp/txl_sd.safetensors"
expect 0 "$conv" "$tmp/txl_model.pt" "$tmp/txl_model.safetensors" --vocab "$tmp/vocab.json" \
    --n_layer 4 --d_model 128 --n_head 4 --d_head 32 --d_inner 512
meta "$tmp/txl_model.safetensors" 'c["mem_len"] == 96 and c["tgt_len"] == 48 and c["n_blocks"] == 8'
same_bpc "$tmp/par_ref.safetensors" "$tmp/txl_model.safetensors"
expect 0 "$conv" "$tmp/txl_untied.pt" "$tmp/txl_untied.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48
meta "$tmp/txl_untied.safetensors" 'c["tie_weight"] is False and "out.weight" in names'
same_bpc "$tmp/par_untied_ref.safetensors" "$tmp/txl_untied.safetensors"

# ---- vocabularies from the training text
expect 0 "$conv" "$tmp/tiny_aspan5.pt" "$tmp/tiny5.safetensors" --text "$tmp/train5.txt" --block-sz 8 --adapt-span-ramp 4
meta "$tmp/tiny5.safetensors" 'v == ["a", "b", "c", "\n", "d"]'
printf 'abcd\nbad\n' >"$tmp/tiny_text.txt"
expect 0 "$bin" score --json --model "$tmp/tiny5.safetensors" "$tmp/tiny_text.txt"
expect 1 notorch "$conv" "$tmp/tiny_aspan3.pt" "$tmp/w.safetensors" --text "$tmp/words.txt" --block-sz 8 --adapt-span-ramp 4
contains "$tmp/err" "not one character"
expect 0 "$conv" "$tmp/tiny_txl3.pt" "$tmp/tinytxl.safetensors" --text "$tmp/txl_train.txt" \
    --text "$tmp/txl_valid.txt" --text "$tmp/txl_test.txt" --mem_len 4 --tgt_len 4
meta "$tmp/tinytxl.safetensors" 'v == ["c", "b", "a"]'
expect 1 notorch "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --text "$tmp/train5.txt" --block-sz 64 --adapt-span-ramp 32
contains "$tmp/err" "the model has 65 tokens"

# ---- errors: each a clear message, exit 1, no file written. What is wrong
# is in the layout, the flags or the vocabulary, after the file is read, so
# they read with torch blocked (the converter's own reader: the same tensors,
# as the conversions above check, without torch's seconds of import); a file
# torch cannot read at all (text.pt) goes through torch.
expect 1 notorch "$conv" "$tmp/other.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json"
contains "$tmp/err" "neither an adaptive-span checkpoint"
expect 1 "$conv" "$tmp/text.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json"
contains "$tmp/err" "not a PyTorch checkpoint"
expect 1 notorch "$conv" "$A" "$tmp/x.safetensors" --vocab "$tmp/vocab.json"
contains "$tmp/err" "safetensors file"
expect 1 notorch "$conv" "$tmp/nonexistent.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json"
contains "$tmp/err" "no such file"
expect 1 notorch "$conv" "$tmp/aspan_missing.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32
contains "$tmp/err" "missing tensor 'layers.1.ff.fc2.bias'"
expect 1 notorch "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32 --nheads 8
contains "$tmp/err" "--nheads 8 contradicts the checkpoint"
expect 1 notorch "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32 --hid-sz 256
contains "$tmp/err" "--hid-sz 256 contradicts"
expect 1 notorch "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32 --attn-span 1024
contains "$tmp/err" "--attn-span 1024 contradicts"
expect 1 notorch "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64
contains "$tmp/err" "adapt-span-ramp"
expect 1 notorch "$conv" "$tmp/txl_sd.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48 --n_layer 6
contains "$tmp/err" "--n_layer 6 contradicts"
expect 1 notorch "$conv" "$tmp/txl_sd.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48 --d_inner 2048
contains "$tmp/err" "--d_inner 2048 contradicts"
expect 1 notorch "$conv" "$tmp/txl_sd.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48 --d_head 64
contains "$tmp/err" "--d_head 64 contradicts"
expect 1 notorch "$conv" "$tmp/txl_model.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 128
contains "$tmp/err" "--mem_len 128 contradicts"
expect 1 notorch "$conv" "$tmp/txl_sd.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --tgt_len 48
contains "$tmp/err" "mem_len"
expect 1 notorch "$conv" "$tmp/txl_adaptive.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48 --tokenizer chars
contains "$tmp/err" "adaptive softmax"
# the same file as a word-level model: its cutoffs are not in the tensors, and
# it lacks crit.cluster_bias
expect 1 notorch "$conv" "$tmp/txl_adaptive.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48
contains "$tmp/err" "pass --cutoffs as trained"
expect 1 notorch "$conv" "$tmp/txl_adaptive.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48 --cutoffs 60
contains "$tmp/err" "missing tensor 'crit.cluster_bias'"
expect 1 notorch "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --vocab "$tmp/train5.txt" --block-sz 64 --adapt-span-ramp 32
contains "$tmp/err" "vocabulary file"
[ ! -e "$tmp/x.safetensors" ] && ok || bad "a failed conversion left $tmp/x.safetensors"
expect 2 notorch "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors"
contains "$tmp/err" "--text FILE"

# ---- word-level Transformer-XL: ../shared's txl-word fixture (the
# reference's model.pt, and its tensors as a state_dict and as NVIDIA's
# checkpoint dict) converts back to the fixture itself
if W=$(shared_path fixtures/txl-word/model.safetensors); then
WD=$(dirname "$W")
python3 - "$W" "$TEXT" "$tmp" <<'EOF' || bad "could not write the word-level .pt files"
import argparse, collections, json, struct, sys, types
import numpy as np, torch
W, TEXT, tmp = sys.argv[1:4]
b = open(W, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); m = h.pop("__metadata__")
c, v = json.loads(m["config"]), json.loads(m["vocab"])
t = collections.OrderedDict()
for k in sorted(h):
    s, e = h[k]["data_offsets"]
    t[k] = torch.from_numpy(np.frombuffer(b[8 + n + s:8 + n + e], dtype="<f4").reshape(h[k]["shape"]).copy())
json.dump(v, open(tmp + "/wvocab.json", "w"))
json.dump(["EOS"] + v[1:], open(tmp + "/wvocab_noeos.json", "w"))
open(tmp + "/wvocab.txt", "w", encoding="utf-8").write("".join(s + " 0\n" for s in v))
# the text the fixture's vocabulary was counted over: the first 90% of the lines
lines = open(TEXT, encoding="utf-8").read().split("\n")
open(tmp + "/wtrain.txt", "w", encoding="utf-8").write("".join(l + "\n" for l in lines[:int(0.9 * len(lines))]))
# a bare state_dict under the reference's names
torch.save(t, tmp + "/wsd.pt")
def without(name, path, **extra):
    u = collections.OrderedDict((k, x) for k, x in t.items() if k != name)
    u.update(extra)
    torch.save(u, path)
without("layers.2.pos_ff.CoreNet.3.bias", tmp + "/wsd_missing.pt")
without("word_emb.emb_projs.1", tmp + "/wsd_shape.pt", **{"word_emb.emb_projs.1": torch.zeros(128, 63)})
without("", tmp + "/wsd_attn1.pt", r_emb=torch.zeros(4, 64, 4, 32))
# NVIDIA DeepLearningExamples train.py's save_checkpoint: its adaptive
# softmax keeps biases in crit.out_layers_biases, leaves tied weights and
# projections out of crit (crit.shared_out_projs is word_emb.emb_projs again)
ms = collections.OrderedDict()
for k, x in t.items():
    if k.startswith("crit.out_layers.") and k.endswith(".weight"):
        continue
    if k.startswith("crit.out_layers.") and k.endswith(".bias"):
        ms["crit.out_layers_biases." + k.split(".")[2]] = x
    elif k.startswith("crit.out_projs.") and k != "crit.out_projs.0":
        continue
    else:
        ms[k] = x
for i in range(3):
    ms["crit.shared_out_projs.%d" % i] = t["word_emb.emb_projs.%d" % i]
sys.modules["utils"] = types.ModuleType("utils")
sys.modules["utils.vocabulary"] = types.ModuleType("utils.vocabulary")
class Vocab(object):
    pass
Vocab.__module__ = "utils.vocabulary"; sys.modules["utils.vocabulary"].Vocab = Vocab
voc = Vocab()
voc.__dict__.update(counter=collections.Counter(), special=["<eos>", "<unk>"], min_freq=2, max_size=None,
                    lower_case=False, delimiter=None, vocab_file=None, idx2sym=list(v),
                    sym2idx=collections.OrderedDict((s, i) for i, s in enumerate(v)), eos_idx=0, unk_idx=1)
mc = dict(n_token=len(v), n_layer=4, n_head=4, d_model=128, d_head=32, d_inner=512, dropout=0.1, dropatt=0.0,
          dtype=None, tie_weight=True, d_embed=128, div_val=2, tie_projs=[False, True, True], pre_lnorm=False,
          tgt_len=32, ext_len=0, mem_len=32, cutoffs=[1000, 4000], same_length=True, attn_type=0, clamp_len=80,
          sample_softmax=-1)
args = argparse.Namespace(dataset="wt103", vocab="word", tgt_len=32, mem_len=32, eval_tgt_len=48)
ck = {"args": args, "model_config": mc, "model_state": ms, "optimizer_state": {"state": {}, "param_groups": []},
      "scheduler_state": {}, "vocab": voc, "amp_state": None, "epoch": 1, "batch": 0, "last_iter": 0,
      "train_step": 2400, "best_val_loss": 5.65}
torch.save(ck, tmp + "/nvidia.pt")
torch.save(dict(ck, model_config=dict(mc, attn_type=2)), tmp + "/nvidia_attn2.pt")
torch.save(dict(ck, args=argparse.Namespace(dataset="wt103", vocab="bpe")), tmp + "/nvidia_bpe.pt")
EOF
# same_word OUT: the tensors bit-equal to the fixture's under the same names,
# the config equal on the keys both have, the vocabulary equal
same_word() {
    python3 - "$W" "$1" <<'EOF' && ok || bad "$1 differs from the fixture"
import json, struct, sys
def read(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); m = h.pop("__metadata__")
    return ({k: (x["shape"], b[8 + n + x["data_offsets"][0]:8 + n + x["data_offsets"][1]]) for k, x in h.items()},
            json.loads(m["config"]), json.loads(m["vocab"]))
(ta, ca, va), (tb, cb, vb) = read(sys.argv[1]), read(sys.argv[2])
bad = [k for k in set(ta) | set(tb) if ta.get(k) != tb.get(k)]
cfg = [k for k in set(ca) & set(cb) if ca[k] != cb[k]]
for k in bad[:5]: print("tensor %s differs or is missing" % k)
for k in cfg: print("config %s: %r vs %r" % (k, ca[k], cb[k]))
if va != vb: print("vocab differs")
sys.exit(1 if bad or cfg or va != vb or len(set(ca) & set(cb)) < 20 else 0)
EOF
}
expect 0 "$conv" "$WD/model.pt" "$tmp/w_pt.safetensors" --vocab "$tmp/wvocab.json" --tgt_len 32 --mem_len 32
contains "$tmp/out" "9984 words"
same_word "$tmp/w_pt.safetensors"
# the same scores as the fixture
python3 -c "import sys; t=open(sys.argv[1]).read(); sys.stdout.write(t[int(0.9*len(t)):][:int(sys.argv[2])])" "$TEXT" "$ntext" >"$tmp/wtext.txt"
"$bin" score --json --model "$W" "$tmp/wtext.txt" >"$tmp/s1" 2>&1 && "$bin" score --json --model "$tmp/w_pt.safetensors" "$tmp/wtext.txt" >"$tmp/s2" 2>&1 \
    && cmp -s "$tmp/s1" "$tmp/s2" && ok || bad "the converted model.pt scores differently: $(cat "$tmp/s1") vs $(cat "$tmp/s2")"
# the vocabulary rebuilt from the training text as the reference's Vocab
# (special <eos>, <unk>; min_freq 2), or read from a vocab_file
expect 0 "$conv" "$WD/model.pt" "$tmp/w_text.safetensors" --text "$tmp/wtrain.txt" --special '<unk>' --min-freq 2 --tgt_len 32 --mem_len 32
same_word "$tmp/w_text.safetensors"
expect 0 "$conv" "$WD/model.pt" "$tmp/w_vtxt.safetensors" --vocab "$tmp/wvocab.txt" --tgt_len 32 --mem_len 32
same_word "$tmp/w_vtxt.safetensors"
expect 1 notorch "$conv" "$WD/model.pt" "$tmp/x.safetensors" --text "$tmp/wtrain.txt" --min-freq 2 --tgt_len 32 --mem_len 32
contains "$tmp/err" "add --special '<unk>'"
# model.pt holds the evaluation's lengths (set after it was built): the
# trained ones must be given, and add up to what it was built for
expect 1 notorch "$conv" "$WD/model.pt" "$tmp/x.safetensors" --vocab "$tmp/wvocab.json"
contains "$tmp/err" "pass --tgt_len and --mem_len as trained"
expect 1 notorch "$conv" "$WD/model.pt" "$tmp/x.safetensors" --vocab "$tmp/wvocab.json" --tgt_len 32 --mem_len 64
contains "$tmp/err" "tgt_len + mem_len = 64"
# a state_dict: the evaluation settings from flags
expect 0 "$conv" "$tmp/wsd.pt" "$tmp/w_sd.safetensors" --vocab "$tmp/wvocab.json" --tgt_len 32 --mem_len 32 \
    --eval-tgt-len 48 --eval-mem-len 96 --eval-clamp-len 80 --eval-same-length
same_word "$tmp/w_sd.safetensors"
expect 0 "$conv" "$tmp/wsd.pt" "$tmp/w_sd2.safetensors" --vocab "$tmp/wvocab.json" --tgt_len 32 --mem_len 32
meta "$tmp/w_sd2.safetensors" 'c["eval_tgt_len"] == 32 and c["eval_mem_len"] == 32 and c["eval_clamp_len"] == -1 and c["eval_same_length"] is False and c["tie_projs"] == [False, True, True] and c["tie_weight"] is True'
# NVIDIA: the vocabulary from the checkpoint; its same_length mask shows a
# query one key more than the reference's, which is eval_mem_len + 1 here
expect 0 "$conv" "$tmp/nvidia.pt" "$tmp/w_nv.safetensors" --eval-tgt-len 48 --eval-mem-len 95
contains "$tmp/err" "mem_len + 1 keys"
same_word "$tmp/w_nv.safetensors"
# errors
expect 1 notorch "$conv" "$tmp/wsd.pt" "$tmp/x.safetensors" --vocab "$tmp/wvocab.json" --tgt_len 32
contains "$tmp/err" "pass --mem_len"
expect 1 notorch "$conv" "$tmp/wsd_missing.pt" "$tmp/x.safetensors" --vocab "$tmp/wvocab.json" --tgt_len 32 --mem_len 32
contains "$tmp/err" "missing tensor 'layers.2.pos_ff.CoreNet.3.bias'"
expect 1 notorch "$conv" "$tmp/wsd_shape.pt" "$tmp/x.safetensors" --vocab "$tmp/wvocab.json" --tgt_len 32 --mem_len 32
contains "$tmp/err" "'word_emb.emb_projs.1' has shape \[128, 63\], expected \[128, 64\]"
expect 1 notorch "$conv" "$tmp/wsd_attn1.pt" "$tmp/x.safetensors" --vocab "$tmp/wvocab.json" --tgt_len 32 --mem_len 32
contains "$tmp/err" "attn_type 1 or 3"
expect 1 notorch "$conv" "$tmp/nvidia_attn2.pt" "$tmp/x.safetensors"
contains "$tmp/err" "attn_type 2: only Transformer-XL's relative attention"
expect 1 notorch "$conv" "$tmp/nvidia_bpe.pt" "$tmp/x.safetensors"
contains "$tmp/err" "GPT-2 tokenizer"
expect 1 notorch "$conv" "$tmp/wsd.pt" "$tmp/x.safetensors" --vocab "$tmp/wvocab.json" --tgt_len 32 --mem_len 32 --div_val 4
contains "$tmp/err" "--div_val 4 contradicts"
expect 1 notorch "$conv" "$tmp/wsd.pt" "$tmp/x.safetensors" --vocab "$tmp/wvocab_noeos.json" --tgt_len 32 --mem_len 32
contains "$tmp/err" "no '<eos>'"
expect 1 notorch "$conv" "$tmp/wsd.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --tgt_len 32 --mem_len 32
contains "$tmp/err" "not one whitespace-free word"
[ ! -e "$tmp/x.safetensors" ] && ok || bad "a failed word-level conversion left $tmp/x.safetensors"
expect 2 notorch "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32 --eval-tgt-len 8
contains "$tmp/err" "word-level Transformer-XL models only"
else
    echo "SKIP test_convert.sh word-level: no $shared/fixtures/txl-word (set SPANSERVE_SHARED)"
fi

# ---- adaptive-span with persistent memory (all-attention layers): the trainer's checkpoint, with the span
# module listed twice as the reference's state_dict lists it, converts back to the fixture
AA="$shared/fixtures/allattn-small/model.safetensors"
if [ -f "$AA" ]; then
    python3 - "$AA" "$tmp" <<'EOF' || bad "could not write the persistent-memory .pt files"
import collections, json, struct, sys
import numpy as np, torch
AA, tmp = sys.argv[1:3]
b = open(AA, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); h.pop("__metadata__")
t = collections.OrderedDict()
for k in sorted(h):
    s, e = h[k]["data_offsets"]
    t[k] = torch.from_numpy(np.frombuffer(b[8 + n + s:8 + n + e], dtype="<f4").reshape(h[k]["shape"]).copy())
torch.save({"nb_iter": 3000, "model": collections.OrderedDict(("module." + k, v) for k, v in t.items())},
           tmp + "/allattn.pt")
t2 = collections.OrderedDict(t)
k = "layers.1.attn.attn.persistent_memory.adaptive_span._mask.current_val"
t2[k] = t2[k] + 0.25
torch.save(t2, tmp + "/allattn_bad.pt")
t3 = collections.OrderedDict(t)
t3["layers.0.ff.fc1.weight"] = torch.zeros(512, 128)
torch.save(t3, tmp + "/allattn_ff.pt")
EOF
    expect 0 "$conv" "$tmp/allattn.pt" "$tmp/allattn.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32
    meta "$tmp/allattn.safetensors" 'c["pers_mem_size"] == 24 and "inner_hidden_size" not in c and not any(".ff." in x or ".norm2." in x for x in names) and "layers.3.attn.attn.persistent_memory.val" in names'
    same_bpc "$AA" "$tmp/allattn.safetensors"
    expect 1 notorch "$conv" "$tmp/allattn_bad.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32
    contains "$tmp/err" "shares one span module"
    expect 1 notorch "$conv" "$tmp/allattn_ff.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32
    contains "$tmp/err" "persistent memory and feed-forward"
else
    echo "SKIP test_convert.sh persistent memory: no $shared/fixtures/allattn-small (set SPANSERVE_SHARED)"
fi

# ---- without torch: the same files read by convert's own reader of the zip format, torch blocked in the
# Python it runs in; the outputs are the files torch's reading gave, byte for byte
expect 0 notorch "$conv" "$tmp/aspan.pt" "$tmp/nt_aspan.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32
same_file "$tmp/aspan.safetensors" "$tmp/nt_aspan.safetensors"
expect 0 notorch "$conv" "$tmp/txl_model.pt" "$tmp/nt_txl_model.safetensors" --vocab "$tmp/vocab.json" \
    --n_layer 4 --d_model 128 --n_head 4 --d_head 32 --d_inner 512
same_file "$tmp/txl_model.safetensors" "$tmp/nt_txl_model.safetensors"
if [ -f "$tmp/w_pt.safetensors" ]; then
    expect 0 notorch "$conv" "$WD/model.pt" "$tmp/nt_w_pt.safetensors" --vocab "$tmp/wvocab.json" --tgt_len 32 --mem_len 32
    same_file "$tmp/w_pt.safetensors" "$tmp/nt_w_pt.safetensors"
fi
if [ -f "$tmp/allattn.safetensors" ]; then
    expect 0 notorch "$conv" "$tmp/allattn.pt" "$tmp/nt_allattn.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32
    same_file "$tmp/allattn.safetensors" "$tmp/nt_allattn.safetensors"
fi
printf 'not a zip' >"$tmp/old.pt"
expect 1 notorch "$conv" "$tmp/old.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32
contains "$tmp/err" "needs torch installed"

# ---- Hugging Face: small random TransfoXLLMHeadModel directories, scored by
# spanserve against transformers' own numbers (its own counts; SKIP without
# transformers)
python3 tests/test_convert_hf.py "$bin" "$conv" >"$tmp/hf" 2>&1; rc=$?
grep -E '^(FAIL|SKIP)|predictions, nll' "$tmp/hf"
line=$(grep -E '^test_convert_hf.py: [0-9]+ passed, [0-9]+ failed' "$tmp/hf" | tail -n 1)
if [ -z "$line" ]; then
    bad "tests/test_convert_hf.py exited $rc without its counts: $(tail -c 800 "$tmp/hf")"
else
    pass=$((pass + $(echo "$line" | sed -E 's/.* ([0-9]+) passed.*/\1/')))
    fail=$((fail + $(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')))
    [ $rc -ne 0 ] && ! grep -q '^FAIL' "$tmp/hf" && bad "tests/test_convert_hf.py exited $rc"
fi

echo "test_convert.sh: $pass passed, $fail failed"
[ "$fail" = 0 ]
