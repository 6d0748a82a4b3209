#!/bin/sh
# test_convert.sh - clients/convert: the fixtures' weights saved as the
# reference trainers save them (an adaptive-span trainer checkpoint with
# DataParallel's `module.` prefixes; a Transformer-XL state_dict and a whole
# pickled MemTransformerLM), converted back, must score a text exactly as the
# original checkpoints do; vocabularies rebuilt from text as the references
# build them; every error case a clear message and exit status 1.
# Needs torch (the GPU machine has it); skipped where it is missing.
if ! python3 -c 'import torch' >/dev/null 2>&1; then
    echo "SKIP test_convert.sh: torch is not installed (the GPU machine has it)"
    echo "test_convert.sh: 0 passed, 0 failed"
    exit 0
fi
bin=${SPANSERVE_BIN:-bin/spanserve}
. tests/fixtures.sh   # $A, $P, $TEXT
conv=${SPANSERVE_CONVERT:-clients/convert}
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

# 20000 characters of the validation text
python3 -c "import sys; t=open(sys.argv[1]).read(); sys.stdout.write(t[int(0.9*len(t)):][:20000])" \
    "$TEXT" >"$tmp/text.txt"

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
expect 1 "$conv" "$tmp/tiny_aspan3.pt" "$tmp/w.safetensors" --text "$tmp/words.txt" --block-sz 8 --adapt-span-ramp 4
contains "$tmp/err" "not one character"
expect 0 "$conv" "$tmp/tiny_txl3.pt" "$tmp/tinytxl.safetensors" --text "$tmp/txl_train.txt" \
    --text "$tmp/txl_valid.txt" --text "$tmp/txl_test.txt" --mem_len 4 --tgt_len 4
meta "$tmp/tinytxl.safetensors" 'v == ["c", "b", "a"]'
expect 1 "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --text "$tmp/train5.txt" --block-sz 64 --adapt-span-ramp 32
contains "$tmp/err" "the model has 65 tokens"

# ---- errors: each a clear message, exit 1, no file written
expect 1 "$conv" "$tmp/other.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json"
contains "$tmp/err" "neither an adaptive-span checkpoint"
expect 1 "$conv" "$tmp/text.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json"
contains "$tmp/err" "not a PyTorch checkpoint"
expect 1 "$conv" "$A" "$tmp/x.safetensors" --vocab "$tmp/vocab.json"
contains "$tmp/err" "safetensors file"
expect 1 "$conv" "$tmp/nonexistent.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json"
contains "$tmp/err" "no such file"
expect 1 "$conv" "$tmp/aspan_missing.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32
contains "$tmp/err" "missing tensor 'layers.1.ff.fc2.bias'"
expect 1 "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32 --nheads 8
contains "$tmp/err" "--nheads 8 contradicts the checkpoint"
expect 1 "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32 --hid-sz 256
contains "$tmp/err" "--hid-sz 256 contradicts"
expect 1 "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64 --adapt-span-ramp 32 --attn-span 1024
contains "$tmp/err" "--attn-span 1024 contradicts"
expect 1 "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --block-sz 64
contains "$tmp/err" "adapt-span-ramp"
expect 1 "$conv" "$tmp/txl_sd.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48 --n_layer 6
contains "$tmp/err" "--n_layer 6 contradicts"
expect 1 "$conv" "$tmp/txl_sd.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48 --d_inner 2048
contains "$tmp/err" "--d_inner 2048 contradicts"
expect 1 "$conv" "$tmp/txl_sd.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48 --d_head 64
contains "$tmp/err" "--d_head 64 contradicts"
expect 1 "$conv" "$tmp/txl_model.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 128
contains "$tmp/err" "--mem_len 128 contradicts"
expect 1 "$conv" "$tmp/txl_sd.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --tgt_len 48
contains "$tmp/err" "mem_len"
expect 1 "$conv" "$tmp/txl_adaptive.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48 --tokenizer chars
contains "$tmp/err" "adaptive softmax"
# the same file as a word-level model: its cutoffs are not in the tensors, and
# it lacks crit.cluster_bias
expect 1 "$conv" "$tmp/txl_adaptive.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48
contains "$tmp/err" "pass --cutoffs as trained"
expect 1 "$conv" "$tmp/txl_adaptive.pt" "$tmp/x.safetensors" --vocab "$tmp/vocab.json" --mem_len 96 --tgt_len 48 --cutoffs 60
contains "$tmp/err" "missing tensor 'crit.cluster_bias'"
expect 1 "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors" --vocab "$tmp/train5.txt" --block-sz 64 --adapt-span-ramp 32
contains "$tmp/err" "vocabulary file"
[ ! -e "$tmp/x.safetensors" ] && ok || bad "a failed conversion left $tmp/x.safetensors"
expect 2 "$conv" "$tmp/aspan.pt" "$tmp/x.safetensors"
contains "$tmp/err" "--text FILE"

echo "test_convert.sh: $pass passed, $fail failed"
[ "$fail" = 0 ]
