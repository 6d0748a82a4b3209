#!/usr/bin/env python3
"""test_convert_hf.py - clients/convert on Hugging Face TransfoXLLMHeadModel
directories. Small random models with an adaptive softmax (div_val 2; div_val
1 with projections; div_val 1 without, its output untied, shared r biases,
pre_lnorm) are saved with save_pretrained beside a TransfoXLTokenizer
vocabulary, converted, and scored by `spanserve score`: the number of
predictions and the total nll must equal what transformers computes over the
same tokens, fed in segments of the converted eval_tgt_len with memory
carried (starting empty, as the reference's init_mems; Hugging Face's own
starts with mem_len rows of zeros), its mem_len, clamp_len and same_length
set as the converter recorded them, to 1e-4 relative.

Usage: tests/test_convert_hf.py SPANSERVE_BIN CONVERT
Prints a FAIL line for each failed check and ends with
'test_convert_hf.py: N passed, N failed'; says SKIP (with the pip command)
where transformers with TransfoXLLMHeadModel is not installed.
"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings

PIP = "pip install torch 'transformers==4.35.2' sacremoses"
try:
    import torch
    try:
        from transformers import TransfoXLConfig, TransfoXLLMHeadModel, TransfoXLModel, TransfoXLTokenizer
    except ImportError:  # 4.36 and later keep it here, until its removal
        from transformers.models.deprecated.transfo_xl import (TransfoXLConfig, TransfoXLLMHeadModel,
                                                               TransfoXLModel, TransfoXLTokenizer)
    import sacremoses  # noqa: F401  (TransfoXLTokenizer needs it)
except ImportError as e:
    print("SKIP test_convert_hf.py: transformers with TransfoXLLMHeadModel is not installed (%s): %s" % (e, PIP))
    print("test_convert_hf.py: 0 passed, 0 failed")
    sys.exit(0)

warnings.filterwarnings("ignore")
bin_, conv = sys.argv[1], sys.argv[2]
npass = nfail = 0


def check(ok, what):
    global npass, nfail
    if ok:
        npass += 1
    else:
        nfail += 1
        print("FAIL test_convert_hf.py: %s" % what)
    return ok


def read_meta(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    m = h.pop("__metadata__")
    return json.loads(m["config"]), json.loads(m["vocab"]), h


def tokens(path, sym2idx):
    """Each line's whitespace-split words then <eos>; a word outside the
    vocabulary is <unk> (the reference's encode_file)."""
    out = []
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            out += [sym2idx.get(w, sym2idx["<unk>"]) for w in line.strip().split()] + [sym2idx["<eos>"]]
    return out


def hf_nll(model, ids, c):
    """Total -log p of ids[1:] and their count, segments of eval_tgt_len fed
    with memory carried."""
    tr = model.transformer
    tr.reset_memory_length(c["eval_mem_len"])
    tr.same_length = c["eval_same_length"]
    tr.clamp_len = c["eval_clamp_len"]
    x, y = ids[:-1], ids[1:]
    mems = [torch.empty(0, 1, model.config.d_model) for _ in range(model.config.n_layer)]
    total = 0.0
    with torch.no_grad():
        for s in range(0, len(x), c["eval_tgt_len"]):
            inp = torch.tensor([x[s:s + c["eval_tgt_len"]]])
            out = model(input_ids=inp, mems=mems)
            lp = out.prediction_scores[0].double()
            tgt = torch.tensor(y[s:s + c["eval_tgt_len"]])
            total -= lp[torch.arange(len(tgt)), tgt].sum().item()
            mems = out.mems
    return total, len(y)


def run(args):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    return p.returncode, p.stdout, p.stderr


tmp = tempfile.mkdtemp()
try:
    rng = random.Random(7)
    words = ["w%d" % i for i in range(70)]
    weights = [1.0 / (i + 1) for i in range(len(words))]

    def text(n_lines):
        return "".join(" ".join(rng.choices(words, weights, k=rng.randint(0, 12))) + "\n" for _ in range(n_lines))

    with open(os.path.join(tmp, "train.txt"), "w") as f:
        f.write(text(400))
    with open(os.path.join(tmp, "eval.txt"), "w") as f:
        # words outside the vocabulary too (<unk>), and a last line without its newline
        f.write(text(60).replace("w3 ", "zebra ", 5) + "w1 w2 unseen w0")
    # the vocabulary: <eos>, <unk>, then the words by falling count
    counts = {}
    for line in open(os.path.join(tmp, "train.txt")):
        for w in line.split():
            counts[w] = counts.get(w, 0) + 1
    idx2sym = ["<eos>", "<unk>"] + sorted(counts, key=lambda w: (-counts[w], w))
    V = len(idx2sym)
    with open(os.path.join(tmp, "vocab.txt"), "w") as f:
        f.write("".join(s + "\n" for s in idx2sym))
    sym2idx = {s: i for i, s in enumerate(idx2sym)}
    ids = tokens(os.path.join(tmp, "eval.txt"), sym2idx)

    cases = [
        # name, config, save as safetensors, convert flags
        ("div_val 2", dict(cutoffs=[10, 30], d_model=32, d_embed=32, div_val=2, n_head=3, d_head=8, d_inner=40,
                           n_layer=2, mem_len=12, clamp_len=7, same_length=True, untie_r=True),
         True, ["--tgt_len", "10"]),
        ("div_val 1, d_embed 24", dict(cutoffs=[12, 40], d_model=32, d_embed=24, div_val=1, n_head=2, d_head=12,
                                       d_inner=48, n_layer=2, mem_len=16, clamp_len=9, same_length=True,
                                       untie_r=True),
         False, ["--tgt_len", "8", "--eval-tgt-len", "7", "--eval-mem-len", "11", "--eval-clamp-len", "5"]),
        ("div_val 1, untied", dict(cutoffs=[20], d_model=24, d_embed=24, div_val=1, n_head=2, d_head=12,
                                   d_inner=32, n_layer=3, mem_len=10, clamp_len=6, same_length=True, untie_r=False,
                                   pre_lnorm=True, tie_word_embeddings=False, proj_share_all_but_first=False),
         False, ["--tgt_len", "9"]),
    ]
    for name, kw, safe, flags in cases:
        d = os.path.join(tmp, "hf-" + name.replace(" ", "_").replace(",", ""))
        torch.manual_seed(len(d))
        cfg = TransfoXLConfig(vocab_size=V, dropout=0.0, dropatt=0.0, **kw)
        model = TransfoXLLMHeadModel(cfg)
        with torch.no_grad():  # weights far from the initialiser's near-zero ones
            for n, p in model.named_parameters():
                if n.endswith("layer_norm.weight"):
                    p.copy_(1 + 0.1 * torch.randn_like(p))
                else:
                    p.normal_(0, 0.3)
        model.eval()
        model.save_pretrained(d, safe_serialization=safe)
        tok = TransfoXLTokenizer(vocab_file=os.path.join(tmp, "vocab.txt"), additional_special_tokens=[])
        tok.save_pretrained(d)
        check(list(tok.idx2sym) == idx2sym, "%s: the tokenizer's idx2sym is not the vocabulary built" % name)
        out = os.path.join(tmp, "out.safetensors")
        rc, so, se = run([conv, d, out] + flags)
        if not check(rc == 0, "%s: convert exited %d: %s" % (name, rc, se[-800:])):
            continue
        c, v, names = read_meta(out)
        check(v == idx2sym, "%s: the converted vocabulary is not the tokenizer's" % name)
        check(c["family"] == "transformer-xl" and c["tokenizer"] == "words" and c["vocab_size"] == V
              and c["div_val"] == kw["div_val"] and c["cutoffs"] == kw["cutoffs"]
              and c["tie_projs"] == cfg.tie_projs and c["tie_weight"] == cfg.tie_word_embeddings
              and c["pre_lnorm"] == kw.get("pre_lnorm", False) and c.get("untie_r", False) == kw["untie_r"]
              and c["eval_same_length"] is True and c["mem_len"] == kw["mem_len"],
              "%s: config %s" % (name, json.dumps(c)))
        fl = dict(zip(flags[::2], flags[1::2]))
        check(c["eval_tgt_len"] == int(fl.get("--eval-tgt-len", fl["--tgt_len"]))
              and c["eval_mem_len"] == int(fl.get("--eval-mem-len", kw["mem_len"]))
              and c["eval_clamp_len"] == int(fl.get("--eval-clamp-len", kw["clamp_len"])),
              "%s: eval settings %s, flags %s" % (name, json.dumps(c), flags))
        check(("layers.0.dec_attn.r_w_bias" in names) == kw["untie_r"] and ("r_w_bias" in names) != kw["untie_r"]
              and not any(k.startswith("transformer.") for k in names),
              "%s: tensor names %s" % (name, sorted(names)[:8]))
        total, n = hf_nll(model, ids, c)
        rc, so, se = run([bin_, "score", "--json", "--model", out, os.path.join(tmp, "eval.txt")])
        if not check(rc == 0, "%s: spanserve score exited %d: %s" % (name, rc, se[-800:])):
            continue
        s = json.loads(so)
        check(s["tokens"] == n, "%s: spanserve scored %d predictions, transformers %d" % (name, s["tokens"], n))
        got = s["nll"] * s["tokens"]
        check(abs(got - total) <= 1e-4 * abs(total),
              "%s: total nll %.6f (spanserve) vs %.6f (transformers): %.2e relative"
              % (name, got, total, abs(got - total) / abs(total)))
        print("test_convert_hf.py: %s: %d predictions, nll %.6f (spanserve) vs %.6f (transformers), total %.1e "
              "relative" % (name, n, got / n, total / n, abs(got - total) / abs(total)))

    # the weights file itself names the directory; other kinds of directory are refused
    d = os.path.join(tmp, "hf-div_val_2")
    rc, so, se = run([conv, os.path.join(d, "model.safetensors"), os.path.join(tmp, "w.safetensors"),
                      "--tgt_len", "10"])
    check(rc == 0, "the weights file in a model directory: exit %d: %s" % (rc, se[-400:]))
    g = os.path.join(tmp, "gpt2")
    os.mkdir(g)
    shutil.copy(os.path.join(d, "model.safetensors"), g)
    with open(os.path.join(g, "config.json"), "w") as f:
        json.dump({"model_type": "gpt2"}, f)
    rc, so, se = run([conv, g, os.path.join(tmp, "x.safetensors")])
    check(rc == 1 and "not a Hugging Face Transformer-XL" in se, "a gpt2 directory: exit %d: %s" % (rc, se[-400:]))
    rc, so, se = run([conv, tmp, os.path.join(tmp, "x.safetensors")])
    check(rc == 1 and "without config.json" in se, "a directory without config.json: exit %d: %s" % (rc, se[-400:]))
    b = os.path.join(tmp, "base")
    TransfoXLModel(TransfoXLConfig(vocab_size=V, cutoffs=[10, 30], d_model=16, d_embed=16, div_val=2, n_head=2,
                                   d_head=8, d_inner=16, n_layer=1, mem_len=4)).save_pretrained(b)
    rc, so, se = run([conv, b, os.path.join(tmp, "x.safetensors"), "--tgt_len", "4"])
    check(rc == 1 and "without its language-model head" in se, "a TransfoXLModel: exit %d: %s" % (rc, se[-400:]))
    rc, so, se = run([conv, os.path.join(tmp, "hf-div_val_1_untied"), os.path.join(tmp, "x.safetensors")])
    check(rc == 1 and "--tgt_len" in se, "config.json without tgt_len and no --tgt_len: exit %d: %s" % (rc, se[-400:]))
    check(not os.path.exists(os.path.join(tmp, "x.safetensors")), "a failed conversion wrote its output")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
print("test_convert_hf.py: %d passed, %d failed" % (npass, nfail))
sys.exit(1 if nfail else 0)
