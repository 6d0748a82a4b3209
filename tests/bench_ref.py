#!/usr/bin/env python3
"""
bench_ref.py - the public PyTorch reference implementations, timed on one
device, so that a GPU figure of spanserve can be set beside the reference's
figure measured on the same card in the same session (the shapes are those
of ../shared/bench/README.md).

The reference code is not part of the project. Fetch it, export it into the
git-ignored .dev/ref and point the script at it (these are the defaults):

    git --git-dir=<mirror of facebookresearch/adaptive-span> archive HEAD \
        | tar -x -C .dev/ref/adaptive-span            # commit 27b815fee821
    git --git-dir=<mirror of kimiyoung/transformer-xl> archive HEAD \
        | tar -x -C .dev/ref/transformer-xl           # commit 44781ed21dba

    tests/bench_ref.py [--device cuda|cpu] [--mode eager,compile]
        [--only aspan-enwik8,par-base,txl-wt103,aspan-small] [--runs 5]
        [--tiny] [--adaptive-span DIR] [--transformer-xl DIR]

Files used, imported from those folders as they are (checked against their
git blob ids; a line says when they differ from the commits above):
facebookresearch/adaptive-span@27b815fee821acce2c2d4104cc0720cb1dc74c37
models.py (TransformerSeq), adaptive_span.py, trainer.py (_train_batch, the
step of its train and eval loops), utils.py (get_params over config.py's
PARAMS_CONFIG, get_optimizer_and_scheduler), adagrad_with_grad_clip.py;
kimiyoung/transformer-xl@44781ed21dbaec88b280f74d9ae2877f52b492a5
pytorch/mem_transformer.py (MemTransformerLM, RelPartialLearnableMultiHeadAttn,
PositionwiseFF, AdaptiveEmbedding), pytorch/utils/proj_adaptive_softmax.py.

What is measured (random weights, seeded; eval mode and torch.no_grad()
for inference; every figure is the median of --runs timed runs, each a
fixed number of blocks or steps after a warm-up, torch.cuda.synchronize()
before and after each run):

- aspan-enwik8: TransformerSeq built from experiments/enwik8.sh's flags
  (12 layers, hidden 512, 8 heads, inner 2048, attn_span 8192, adaptive span
  with --adapt-span-cache), vocabulary 256. The spans: each head's
  AdaptiveMask.current_val is set to (span - ramp) / 8192 from
  span-profile.json, so that the head's mask reaches exactly `span` tokens,
  ramp included (get_current_max_size() == span, checked); the reference's
  own trimming then follows from those values (trim_memory, get_cache_size:
  each layer's cache is sized by its longest head, rounded to 64, plus 64).
  Scoring: trainer._train_batch(eval_only=True) on blocks of 512 for 1 and 16
  streams, the hidden-state cache (zeros at first, as full_eval makes it)
  carried from block to block, the NLL read back each block (loss.item()).
  Decode: model(x, h_cache) with blocks of one token for 1 and 64 streams,
  the argmax of the last log-probabilities fed back as the next token. The
  reference caches hidden states, not keys and values: every step
  concatenates the cache with the new token and projects the whole of it to
  keys and values again in each layer; that is the reference's cost and it is
  measured as it is.
- aspan-small: experiments/enwik8_small.sh (8 layers, hidden 256, 4 heads,
  inner 1024, attn_span 1024, block 256, batch 64, Adagrad lr 0.07 with the
  reference's per-parameter grad clip 0.03, lr warm-up 8000, adaptive-span
  loss 2e-6, dropout 0), one trainer._train_batch a step (forward, NLL plus
  span loss, backward, scheduler, AdagradWithGradClip, clamp of the spans),
  the cache carried. The spans start where the reference starts them
  (--adapt-span-init 0: every head at the ramp, 32 tokens; --small-span-init
  changes it).
- par-base: kimiyoung's RelPartialLearnableMultiHeadAttn (a) and
  PositionwiseFF (f) sublayers, post-LayerNorm (pre_lnorm False) as in
  kimiyoung, arranged as 24 PAR blocks `afff`x4 + `f`x8, d_model 512, 8 heads
  of 64, d_inner 2048, vocabulary 256, input and output embeddings as
  MemTransformerLM makes them for a vocabulary without cutoffs
  (AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax, tied), same_length False,
  clamp_len -1. The class below subclasses MemTransformerLM: its forward
  and _update_mems are the reference's; only _forward is written here, the
  reference's attn_type 0 loop over the PAR blocks instead of decoder
  layers. The memory of an attention block is its input of the previous
  segments (mem_len 512), carried as MemTransformerLM carries it. Scoring:
  segments of 512 for 1 and 16 streams (model(data, target, *mems), the
  loss read back as eval.py does), the memory filled by one segment first.
  Decode: 1 and 64 streams, segments of one token (_forward, then the logits
  of the tied output layer and their argmax fed back), after a segment of
  512 that fills the memory; the reference recomputes the keys and values
  of the whole memory in every attention block every step.
- txl-wt103: MemTransformerLM with 16 layers, d_model 512, 8 heads of 64,
  d_inner 2048, vocabulary 267,735, cutoffs [20000, 40000, 200000], div_val
  1, adaptive input and ProjectedAdaptiveLogSoftmax, tie_weight and
  tie_projs as train.py makes them for wt103, attn_type 0, initialised as
  train.py's weights_init does, evaluated with run_wt103_base.sh's eval
  settings: tgt_len 64, mem_len 640, clamp_len 400, same_length. Scoring:
  1 and 32 streams, segments of 64, the memory carried (ten segments fill it
  before timing), the loss (each target's NLL) as the output, read back each
  segment as eval.py does; tokens drawn uniformly, and by Zipf's law
  P(id) ~ 1/(id+1) (which routes most targets to the head of the adaptive
  softmax). A set of segments is drawn once and cycled, so that the warm-up
  has met every shape that the timed runs meet.

Modes: eager (float32, TF32 off: torch.backends.cuda.matmul.allow_tf32 =
False, set here explicitly, the reference's default) and compile
(torch.compile of the same forward, default mode unless --compile-mode,
inside torch.autocast(bfloat16); the optimizer of aspan-small, its loss and
the reference's loops stay eager). The reference's .item() calls (span
sizes in every layer, mask.any() in every attention) break the compiled
graphs; that is measured as it is.

Shims, applied by monkeypatching here, never in the reference files, and
each only when this PyTorch needs it (a line lists those applied):
- mem_transformer builds uint8 attention masks (.byte()), which masked_fill
  no longer accepts: RelPartialLearnableMultiHeadAttn.forward is wrapped to
  turn a uint8 mask into bool first.
- mem_transformer puts 'utils' on sys.path relative to the working folder:
  pytorch/utils is put on sys.path here.
- proj_adaptive_softmax reads torch.version.cuda at import (None on a
  CPU-only build): set to "0.0" for the import alone.
- AdagradWithGradClip.step uses the deprecated addcmul_(value, t1, t2) and
  addcdiv_(value, t1, t2) overloads and the state that Adagrad's __init__
  fills: where either is gone, it is replaced by the same step with the
  value as a keyword (and the state filled on first use).
- torch.ger, if removed, is torch.outer.

Output: a line per figure (`ref aspan-enwik8 eager-fp32 score 16x512: 104555
tok/s ...`), then a markdown table (rows: model and figure; columns: eager
fp32, compiled bf16, in tokens/s), the card, the torch version and the time
the whole run took. A figure that fails prints FAIL with the error, the rest
goes on, and the exit status is 1. --tiny shrinks every shape (layers,
widths, vocabulary, spans, blocks) for a smoke test on the CPU.
"""
import argparse
import contextlib
import gc
import hashlib
import io
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings

import torch
import torch._dynamo
import torch.nn as nn

# span-profile.json (../shared/bench), used when that file is not found:
# per-layer, per-head spans in tokens, ramp included, for 12 layers x 8 heads
# and a maximum span of 8192.
SPAN_PROFILE = {
    "max_span": 8192, "ramp": 32,
    "spans": [[32] * 8] * 5 + [
        [113, 115, 48, 277, 48, 54, 66, 501],
        [50, 48, 49, 58, 174, 3606, 50, 420],
        [1232, 105, 113, 48, 139, 406, 764, 48],
        [1874, 225, 51, 62, 48, 73, 53, 50],
        [463, 48, 88, 7652, 1579, 73, 48, 1185],
        [1318, 238, 961, 147, 873, 146, 49, 932],
        [48, 122, 57, 54, 450, 1223, 91, 87]]}

# Git blob ids of the reference files at the commits named above.
REF_BLOBS = {
    "adaptive-span": ("27b815fee821", {
        "models.py": "7ae37ecd1d99d083cd814276db4e02af436a3584",
        "adaptive_span.py": "a4ee933d024004bc75311a5f56a5183b775ce209",
        "trainer.py": "cc0d662feb301456dff14ddeea61a5ae0a0ab2c0",
        "utils.py": "29b7775660b42d054c0fe23dbb3fb56f617b5dc7",
        "config.py": "fe362a6669975cf8095921351eed090133f84ccc",
        "adagrad_with_grad_clip.py":
            "1ad9f9808fc2128072ff445cbb148fb1c20df958"}),
    "transformer-xl": ("44781ed21dba", {
        "pytorch/mem_transformer.py":
            "45147dfed951cfe90200e66580e176777e23a306",
        "pytorch/utils/proj_adaptive_softmax.py":
            "a0fbfeb76dab1da1b8c43bcea9f5465b167bf885"}),
}

MODELS = ("aspan-enwik8", "par-base", "txl-wt103", "aspan-small")
MODES = {"eager": "eager-fp32", "compile": "compiled-bf16"}

# Shapes and step counts. Each timed run is `iters` blocks (or steps); the
# counts keep everything, both modes, within about 4 minutes on an H100
# (compilation included). One stream is bound by the host (launches and the
# reference's .item() calls), so its runs are longer, to steady the median.
FULL = {
    "aspan_flags": [
        "--nlayers", "12", "--hid-sz", "512", "--inner-hid-sz", "2048",
        "--nheads", "8", "--attn-span", "8192", "--block-sz", "512",
        "--batch-sz", "64", "--lr", "0.07", "--momentum", "0",
        "--dropout", "0.3", "--optim", "adagrad", "--lr-warmup", "32000",
        "--grad-clip", "0.03", "--adapt-span", "--adapt-span-loss",
        "0.0000005", "--adapt-span-cache"],
    "aspan_vocab": 256,
    "aspan_score": [(1, 512, 16), (16, 512, 3)],     # streams, block, iters
    "aspan_decode": [(1, 64), (64, 8)],               # streams, iters
    "small_flags": [
        "--nlayers", "8", "--hid-sz", "256", "--inner-hid-sz", "1024",
        "--nheads", "4", "--attn-span", "1024", "--block-sz", "256",
        "--batch-sz", "64", "--lr", "0.07", "--momentum", "0",
        "--dropout", "0", "--optim", "adagrad", "--lr-warmup", "8000",
        "--grad-clip", "0.03", "--adapt-span", "--adapt-span-loss",
        "0.000002", "--adapt-span-cache"],
    "small_iters": 5,
    "par": dict(n_token=256, pattern="afff" * 4 + "f" * 8, n_head=8,
                d_model=512, d_head=64, d_inner=2048, mem_len=512),
    "par_score": [(1, 512, 16), (16, 512, 3)],
    "par_decode": [(1, 64), (64, 32)],
    "txl": dict(n_token=267735, n_layer=16, n_head=8, d_model=512,
                d_head=64, d_inner=2048, cutoffs=[20000, 40000, 200000],
                tgt_len=64, mem_len=640, clamp_len=400),
    "txl_score": [(1, 32), (32, 8)],                  # streams, iters
}
TINY = {
    "aspan_flags": [
        "--nlayers", "3", "--hid-sz", "32", "--inner-hid-sz", "64",
        "--nheads", "4", "--attn-span", "256", "--block-sz", "32",
        "--batch-sz", "4", "--lr", "0.07", "--momentum", "0",
        "--dropout", "0.3", "--optim", "adagrad", "--lr-warmup", "32000",
        "--grad-clip", "0.03", "--adapt-span", "--adapt-span-loss",
        "0.0000005", "--adapt-span-cache"],
    "aspan_vocab": 64,
    "aspan_score": [(1, 32, 3), (4, 32, 2)],
    "aspan_decode": [(1, 4), (4, 3)],
    "small_flags": [
        "--nlayers", "2", "--hid-sz", "32", "--inner-hid-sz", "64",
        "--nheads", "2", "--attn-span", "128", "--block-sz", "16",
        "--batch-sz", "4", "--lr", "0.07", "--momentum", "0",
        "--dropout", "0", "--optim", "adagrad", "--lr-warmup", "8000",
        "--grad-clip", "0.03", "--adapt-span", "--adapt-span-loss",
        "0.000002", "--adapt-span-cache"],
    "small_iters": 2,
    "par": dict(n_token=64, pattern="af" * 2 + "f", n_head=4,
                d_model=32, d_head=8, d_inner=64, mem_len=32),
    "par_score": [(1, 32, 3), (4, 32, 2)],
    "par_decode": [(1, 4), (4, 3)],
    "txl": dict(n_token=1000, n_layer=2, n_head=4, d_model=32, d_head=8,
                d_inner=64, cutoffs=[100, 200, 600], tgt_len=16, mem_len=32,
                clamp_len=20),
    "txl_score": [(1, 3), (4, 2)],
}


# ---------------------------------------------------------------- reference

def git_blob_id(path):
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_ref_files(name, root):
    """Says whether the reference files are those of the commit named above."""
    commit, blobs = REF_BLOBS[name]
    differ = [p for p, b in blobs.items()
              if git_blob_id(os.path.join(root, p)) != b]
    if differ:
        print("note: %s files differ from commit %s: %s"
              % (name, commit, ", ".join(differ)))
    else:
        print("reference: %s@%s (%s)" % (name, commit, root))


def adagrad_needs_shim(cls):
    """True when AdagradWithGradClip.step cannot run on this PyTorch: the
    addcmul_(value, t1, t2) and addcdiv_(value, t1, t2) overloads it uses are
    gone, or Adagrad no longer fills its state ('step', 'sum') at __init__."""
    t = torch.ones(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t.addcmul_(1, t, t)
            t.addcdiv_(-torch.tensor(0.5), t, t)
    except (TypeError, RuntimeError):
        return True
    p = nn.Parameter(torch.ones(1))
    state = cls([p], lr=0.1, grad_clip=0.03).state[p]
    return "step" not in state or "sum" not in state


def adagrad_step_shim(self, closure=None):
    """AdagradWithGradClip.step (adagrad_with_grad_clip.py) with value= as a
    keyword; the dense path (the reference has no sparse gradients here)."""
    loss = None
    if closure is not None:
        loss = closure()
    for group in self.param_groups:
        for p in group['params']:
            if p.grad is None:
                continue
            grad = p.grad.data
            state = self.state[p]
            if 'sum' not in state:
                state['step'] = torch.tensor(0.0)
                state['sum'] = torch.full_like(
                    p.data, group['initial_accumulator_value'])
            state['step'] += 1
            if grad.is_sparse:
                raise RuntimeError("shimmed AdagradWithGradClip: sparse "
                                   "gradients are not supported")
            if group['weight_decay'] != 0:
                grad = grad.add(p.data, alpha=group['weight_decay'])
            clr = (group['lr'] /
                   (1 + (state['step'] - 1) * group['lr_decay']))
            clr = self._bench_clip_grad(clr=clr, grad=grad,
                                        group_grad_clip=group['grad_clip'])
            state['sum'].addcmul_(grad, grad, value=1)
            std = state['sum'].sqrt().add_(1e-10)
            p.data.addcdiv_(grad, std, value=-float(clr))
    return loss


def load_adaptive_span(root, shims):
    root = os.path.abspath(root)
    if not os.path.isfile(os.path.join(root, "models.py")):
        sys.exit("bench_ref: no adaptive-span reference in %s (see the "
                 "header of this file)" % root)
    check_ref_files("adaptive-span", root)
    sys.path.insert(0, root)
    import adagrad_with_grad_clip
    import config
    import models
    import trainer
    import utils
    cls = adagrad_with_grad_clip.AdagradWithGradClip
    if adagrad_needs_shim(cls):
        cls._bench_clip_grad = staticmethod(adagrad_with_grad_clip._clip_grad)
        cls.step = adagrad_step_shim
        shims.append("AdagradWithGradClip.step: addcmul_/addcdiv_ with "
                     "value= as a keyword, state filled when absent")
    return dict(models=models, trainer=trainer, utils=utils, config=config)


def load_transformer_xl(root, shims):
    root = os.path.abspath(root)
    src = os.path.join(root, "pytorch")
    if not os.path.isfile(os.path.join(src, "mem_transformer.py")):
        sys.exit("bench_ref: no transformer-xl reference in %s (see the "
                 "header of this file)" % root)
    check_ref_files("transformer-xl", root)
    sys.path.insert(0, os.path.join(src, "utils"))
    sys.path.insert(0, src)
    shims.append("sys.path: transformer-xl's pytorch/utils")
    if not hasattr(torch, "ger"):
        torch.ger = torch.outer
        shims.append("torch.ger = torch.outer")
    cuda_version = torch.version.cuda
    if cuda_version is None:
        torch.version.cuda = "0.0"
        shims.append("torch.version.cuda = '0.0' while importing "
                     "proj_adaptive_softmax")
    try:
        import mem_transformer
    finally:
        torch.version.cuda = cuda_version
    try:
        torch.zeros(1).masked_fill(torch.ones(1, dtype=torch.uint8), 0.0)
    except RuntimeError:
        attn = mem_transformer.RelPartialLearnableMultiHeadAttn
        forward = attn.forward

        def forward_bool_mask(self, w, r, r_w_bias, r_r_bias, attn_mask=None,
                              mems=None):
            if attn_mask is not None and attn_mask.dtype == torch.uint8:
                attn_mask = attn_mask.bool()
            return forward(self, w, r, r_w_bias, r_r_bias,
                           attn_mask=attn_mask, mems=mems)

        attn.forward = forward_bool_mask
        shims.append("RelPartialLearnableMultiHeadAttn.forward: uint8 "
                     "attention mask turned into bool")
    return mem_transformer


# ------------------------------------------------------------------ helpers

class Mode:
    """How a forward runs: eager float32, or torch.compile under bfloat16
    autocast."""

    def __init__(self, key, device, compile_mode):
        self.key = key
        self.name = MODES[key]
        self.device = device
        self.compile_mode = compile_mode
        self.warm_passes = 1 if key == "eager" else 2

    def wrap(self, fn):
        if self.key == "eager":
            return fn
        compiled = torch.compile(fn, mode=self.compile_mode)
        device_type = self.device.type

        def call(*args, **kwargs):
            with torch.autocast(device_type, dtype=torch.bfloat16):
                return compiled(*args, **kwargs)
        return call


class Held:
    """What trainer.py needs of main.py's DataParallel wrapper (which, on
    one device, calls the module directly): a call, .module, .parameters()."""

    def __init__(self, module, call):
        self.module = module
        self._call = call

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def parameters(self):
        return self.module.parameters()


class EvalOptimizer:
    """The optimizer _train_batch is handed in eval: zero_grad() only."""
    grad_clip = 0

    def zero_grad(self):
        pass


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(step, iters, runs, warm_passes, device):
    """Median seconds of `runs` timed runs of `iters` steps, after
    warm_passes x iters untimed steps."""
    for _ in range(warm_passes * iters):
        step()
    sync(device)
    times = []
    for _ in range(runs):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def seeded(seed):
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def quiet(fn, *args, **kwargs):
    """Calls fn with its prints swallowed (the reference's own logging)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Report:
    def __init__(self):
        self.rows = {}       # (model, figure) -> {mode name: text}
        self.failed = False

    def add(self, model, mode, figure, tokens, seconds, steps, extra=""):
        rate = tokens / seconds
        line = "ref %s %s %s: %.0f tok/s (%.2f ms a step)" % (
            model, mode.name, figure, rate, 1000.0 * seconds / steps)
        print(line + (", " + extra if extra else ""), flush=True)
        self.rows.setdefault((model, figure), {})[mode.name] = "%.0f" % rate

    def fail(self, model, mode, figure, err):
        self.failed = True
        print("FAIL ref %s %s %s: %s: %s" % (model, mode.name, figure,
                                             type(err).__name__, err),
              flush=True)
        traceback.print_exc()
        self.rows.setdefault((model, figure), {})[mode.name] = "FAIL"

    def table(self, modes):
        cols = [MODES[m] for m in modes]
        heads = {"eager-fp32": "eager fp32 (tok/s)",
                 "compiled-bf16": "compiled bf16 (tok/s)"}
        out = ["| model / figure | " + " | ".join(heads[c] for c in cols)
               + " |", "| --- |" + " ---: |" * len(cols)]
        for (model, figure), vals in self.rows.items():
            out.append("| %s %s | %s |" % (model, figure, " | ".join(
                vals.get(c, "-") for c in cols)))
        return "\n".join(out)


def figure(report, model, mode, name, fn):
    """Runs one figure; a failure is reported and the run goes on."""
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - reported, never swallowed
        report.fail(model, mode, name, err)
    finally:
        free(mode.device)


# ------------------------------------------------------ adaptive-span models

def build_aspan(ref, flags, vocab):
    params = ref["utils"].get_params(ref["config"].PARAMS_CONFIG, args=flags)
    model = ref["models"].TransformerSeq(
        vocab_size=vocab, **params["model_params"],
        adapt_io_params=params["adapt_io_params"],
        adapt_span_params=params["adapt_span_params"],
        pers_mem_params=params["pers_mem_params"])
    return model, params


def profile_spans(layers, heads, max_span, tiny, path):
    """The per-layer, per-head spans: span-profile.json, or for --tiny the
    same profile scaled to the tiny model (its last layers, first heads)."""
    prof = SPAN_PROFILE
    if path and os.path.isfile(path):
        with open(path) as f:
            prof = json.load(f)
        print("spans: %s" % path)
    else:
        print("spans: the copy of span-profile.json in this file")
    if tiny:
        return [[min(max_span, max(prof["ramp"],
                                   round(s * max_span / prof["max_span"])))
                 for s in row[:heads]] for row in prof["spans"][-layers:]]
    if (prof["max_span"] != max_span or len(prof["spans"]) != layers
            or any(len(row) != heads for row in prof["spans"])):
        raise ValueError("the span profile is not for %d layers x %d heads "
                         "of max span %d" % (layers, heads, max_span))
    return prof["spans"]


def set_spans(model, spans):
    """current_val = (span - ramp) / max_span, so that the head's mask
    (template + current_val * max_span) / ramp + 1, clamped to [0, 1],
    reaches `span` tokens back, ramp included."""
    for layer, row in zip(model.layers, spans):
        asp = layer.attn.attn.adaptive_span
        mask = asp._mask
        val = torch.tensor([(s - mask._ramp_size) / mask._max_size
                            for s in row]).view(-1, 1, 1)
        with torch.no_grad():
            mask.current_val.copy_(val)
        for h, s in enumerate(row):
            got = math.ceil(mask.current_val[h].item() * mask._max_size) \
                + mask._ramp_size
            if min(got, mask._max_size) != s:
                raise ValueError("span of a head: %d, wanted %d" % (got, s))
        if asp.get_current_max_span() != max(row):
            raise ValueError("span of a layer: %d, wanted %d"
                             % (asp.get_current_max_span(), max(row)))


def bench_aspan_enwik8(ref, cfg, mode, args, report):
    device, name = mode.device, "aspan-enwik8"
    gen = seeded(args.seed)
    model, params = build_aspan(ref, cfg["aspan_flags"], cfg["aspan_vocab"])
    mp = params["model_params"]
    set_spans(model, profile_spans(mp["nb_layers"], mp["nb_heads"],
                                   mp["attn_span"], args.tiny,
                                   args.span_profile))
    model.to(device).eval()
    hidden = mp["hidden_size"]
    sizes = [layer.attn.attn.get_cache_size() for layer in model.layers]
    print("aspan-enwik8: cache per layer (get_cache_size) %s: %.1f MB a "
          "stream in fp32" % (sizes, sum(sizes) * hidden * 4 / 1e6))
    held = Held(model, mode.wrap(model))
    vocab = cfg["aspan_vocab"]

    def zero_cache(streams):
        return [torch.zeros(streams, s, hidden, device=device) for s in sizes]

    def score(streams, block, iters):
        data = torch.randint(0, vocab, (streams, iters * block + 1),
                             generator=gen).to(device)
        state = dict(pos=0, cache=zero_cache(streams), loss=[])

        def step():
            pos = state["pos"]
            x = data[:, pos:pos + block].contiguous()
            y = data[:, pos + 1:pos + block + 1].contiguous()
            loss, state["cache"] = ref["trainer"]._train_batch(
                model=held, optimizer=EvalOptimizer(), scheduler=None,
                X=x, Y=y, h_cache=state["cache"], eval_only=True,
                batch_split=1)
            state["loss"].append(loss)
            state["pos"] = (pos + block) % (iters * block)

        with torch.no_grad():
            sec = measure(step, iters, args.runs, mode.warm_passes, device)
        report.add(name, mode, "score %dx%d" % (streams, block),
                   streams * block * iters, sec, iters,
                   "nll %.3f" % statistics.mean(state["loss"]))

    def decode(streams, iters):
        state = dict(x=torch.randint(0, vocab, (streams, 1),
                                     generator=gen).to(device),
                     cache=zero_cache(streams))

        def step():
            out, state["cache"], _ = held(state["x"], state["cache"])
            state["x"] = out[:, -1].argmax(-1, keepdim=True)

        with torch.no_grad():
            sec = measure(step, iters, args.runs, mode.warm_passes, device)
        report.add(name, mode, "decode %d" % streams, streams * iters, sec,
                   iters)

    for streams, block, iters in cfg["aspan_score"]:
        figure(report, name, mode, "score %dx%d" % (streams, block),
               lambda: score(streams, block, iters))
    for streams, iters in cfg["aspan_decode"]:
        figure(report, name, mode, "decode %d" % streams,
               lambda: decode(streams, iters))


def bench_aspan_small(ref, cfg, mode, args, report):
    device, name = mode.device, "aspan-small"
    gen = seeded(args.seed)
    flags = cfg["small_flags"] + ["--adapt-span-init",
                                  str(args.small_span_init)]
    model, params = build_aspan(ref, flags, cfg["aspan_vocab"])
    model.to(device).train()
    mp = params["model_params"]
    streams, block = params["trainer_params"]["batch_size"], mp["block_size"]
    optimizer, scheduler = quiet(ref["utils"].get_optimizer_and_scheduler,
                                 model=model,
                                 optim_params=params["optim_params"])
    held = Held(model, mode.wrap(model))
    iters = cfg["small_iters"]
    data = torch.randint(0, cfg["aspan_vocab"], (streams, iters * block + 1),
                         generator=gen).to(device)
    state = dict(pos=0, loss=[], cache=[
        torch.zeros(streams, layer.attn.attn.get_cache_size(),
                    mp["hidden_size"], device=device)
        for layer in model.layers])

    def step():
        pos = state["pos"]
        x = data[:, pos:pos + block].contiguous()
        y = data[:, pos + 1:pos + block + 1].contiguous()
        loss, state["cache"] = ref["trainer"]._train_batch(
            model=held, optimizer=optimizer, scheduler=scheduler, X=x, Y=y,
            h_cache=state["cache"], eval_only=False, batch_split=1)
        state["loss"].append(loss)
        state["pos"] = (pos + block) % (iters * block)

    def run():
        sec = measure(step, iters, args.runs, mode.warm_passes, device)
        spans = [layer.attn.attn.adaptive_span.get_current_max_span()
                 for layer in model.layers]
        report.add(name, mode, "train %dx%d" % (streams, block),
                   streams * block * iters, sec, iters,
                   "nll %.3f, max span per layer %s"
                   % (statistics.mean(state["loss"]), spans))

    with warnings.catch_warnings():
        # lr_scheduler.step() before optimizer.step(), as trainer.py does
        warnings.simplefilter("ignore", UserWarning)
        figure(report, name, mode, "train %dx%d" % (streams, block), run)


# ----------------------------------------------------- transformer-xl models

def weights_init(model, init_std=0.02, proj_init_std=0.01):
    """train.py's weights_init with its defaults (--init normal, init_std
    0.02, proj_init_std 0.01), applied as train.py applies it."""
    def init(m):
        cls = m.__class__.__name__
        if cls.find("Linear") != -1:
            if getattr(m, "weight", None) is not None:
                nn.init.normal_(m.weight, 0.0, init_std)
            if getattr(m, "bias", None) is not None:
                nn.init.constant_(m.bias, 0.0)
        elif cls.find("AdaptiveEmbedding") != -1:
            for i in range(len(getattr(m, "emb_projs", []))):
                if m.emb_projs[i] is not None:
                    nn.init.normal_(m.emb_projs[i], 0.0, proj_init_std)
        elif cls.find("Embedding") != -1:
            if hasattr(m, "weight"):    # not PositionalEmbedding
                nn.init.normal_(m.weight, 0.0, init_std)
        elif cls.find("ProjectedAdaptiveLogSoftmax") != -1:
            if getattr(m, "cluster_weight", None) is not None:
                nn.init.normal_(m.cluster_weight, 0.0, init_std)
            if getattr(m, "cluster_bias", None) is not None:
                nn.init.constant_(m.cluster_bias, 0.0)
            for i in range(len(getattr(m, "out_projs", []))):
                if m.out_projs[i] is not None:
                    nn.init.normal_(m.out_projs[i], 0.0, proj_init_std)
        elif cls.find("LayerNorm") != -1:
            if hasattr(m, "weight"):
                nn.init.normal_(m.weight, 1.0, init_std)
            if getattr(m, "bias", None) is not None:
                nn.init.constant_(m.bias, 0.0)
        elif cls.find("TransformerLM") != -1:
            for p in ("r_w_bias", "r_r_bias"):
                if hasattr(m, p):
                    nn.init.normal_(getattr(m, p), 0.0, init_std)
    model.apply(init)
    model.word_emb.apply(init)


def par_class(mt):
    class ParTransformerLM(mt.MemTransformerLM):
        """PAR blocks of kimiyoung's sublayers: `pattern` lists them, 'a' a
        RelPartialLearnableMultiHeadAttn, 'f' a PositionwiseFF (each with
        its residual and post-LayerNorm). forward, _update_mems,
        reset_length and _create_params are MemTransformerLM's."""

        def __init__(self, n_token, pattern, n_head, d_model, d_head,
                     d_inner, mem_len, tgt_len, dropout=0.1, dropatt=0.0,
                     same_length=False, clamp_len=-1):
            nn.Module.__init__(self)
            self.n_token, self.d_embed, self.d_model = n_token, d_model, \
                d_model
            self.n_head, self.d_head = n_head, d_head
            self.word_emb = mt.AdaptiveEmbedding(n_token, d_model, d_model,
                                                 [], div_val=1)
            self.drop = nn.Dropout(dropout)
            self.pattern = pattern
            self.n_layer = len(pattern)
            self.tgt_len, self.mem_len, self.ext_len = tgt_len, mem_len, 0
            self.max_klen = tgt_len + mem_len
            self.attn_type = 0
            self.layers = nn.ModuleList(
                mt.RelPartialLearnableMultiHeadAttn(
                    n_head, d_model, d_head, dropout, dropatt=dropatt,
                    tgt_len=tgt_len, ext_len=0, mem_len=mem_len,
                    pre_lnorm=False) if c == "a" else
                mt.PositionwiseFF(d_model, d_inner, dropout, pre_lnorm=False)
                for c in pattern)
            self.sample_softmax = -1
            self.crit = mt.ProjectedAdaptiveLogSoftmax(n_token, d_model,
                                                       d_model, [], div_val=1)
            self.crit.out_layers[0].weight = \
                self.word_emb.emb_layers[0].weight
            self.same_length, self.clamp_len = same_length, clamp_len
            self._create_params()

        def init_mems(self):
            param = next(self.parameters())
            return [torch.empty(0, dtype=param.dtype, device=param.device)
                    for c in self.pattern if c == "a"]

        def _forward(self, dec_inp, mems=None):
            # MemTransformerLM._forward, attn_type 0, over PAR blocks; the
            # memory of an attention block is its input.
            qlen, bsz = dec_inp.size()
            word_emb = self.word_emb(dec_inp)
            mlen = mems[0].size(0) if mems is not None else 0
            klen = mlen + qlen
            ones = word_emb.new_ones(qlen, klen)
            if self.same_length:
                mask_len = klen - self.mem_len
                shift = qlen - mask_len if mask_len > 0 else qlen
                mask = torch.triu(ones, 1 + mlen) + torch.tril(ones, -shift)
            else:
                mask = torch.triu(ones, diagonal=1 + mlen)
            dec_attn_mask = mask.bool()[:, :, None]
            pos_seq = torch.arange(klen - 1, -1, -1.0,
                                   device=word_emb.device,
                                   dtype=word_emb.dtype)
            if self.clamp_len > 0:
                pos_seq.clamp_(max=self.clamp_len)
            pos_emb = self.drop(self.pos_emb(pos_seq))
            core_out = self.drop(word_emb)
            hids = []
            for c, layer in zip(self.pattern, self.layers):
                if c == "a":
                    mems_i = None if mems is None else mems[len(hids)]
                    hids.append(core_out)
                    core_out = layer(core_out, pos_emb, self.r_w_bias,
                                     self.r_r_bias, attn_mask=dec_attn_mask,
                                     mems=mems_i)
                else:
                    core_out = layer(core_out)
            core_out = self.drop(core_out)
            new_mems = self._update_mems(hids, mems, mlen, qlen)
            return core_out, new_mems

    return ParTransformerLM


def txl_score(model, mode, args, report, name, streams, iters, dist, gen,
              n_token):
    """Segments of tgt_len for `streams` streams: model(data, target,
    *mems) as eval.py calls it, the memory filled first."""
    device, tgt_len = mode.device, model.tgt_len
    fill = max(1, -(-model.mem_len // tgt_len))

    def draw(n):
        if dist == "zipf":
            w = 1.0 / torch.arange(1, n_token + 1, dtype=torch.float64)
            ids = torch.multinomial(w, n * streams, replacement=True,
                                    generator=gen)
        else:
            ids = torch.randint(0, n_token, (n * streams,), generator=gen)
        return ids.view(n, streams).to(device)

    fig = "score %dx%d%s" % (streams, tgt_len, " " + dist if dist else "")
    call = mode.wrap(model)
    state = dict(i=0, loss=[])

    def run():
        with torch.no_grad():
            warm = draw(fill * tgt_len + 1)
            mems = ()
            for i in range(fill):   # eager: the memory grows, then stays
                ret = model(warm[i * tgt_len:(i + 1) * tgt_len],
                            warm[i * tgt_len + 1:(i + 1) * tgt_len + 1],
                            *mems)
                mems = tuple(ret[1:])
            state["mems"] = mems
            data = draw(iters * tgt_len + 1)

            def step():
                i = state["i"] * tgt_len
                ret = call(data[i:i + tgt_len], data[i + 1:i + 1 + tgt_len],
                           *state["mems"])
                loss, state["mems"] = ret[0], tuple(ret[1:])
                state["loss"].append(loss.mean().item())
                state["i"] = (state["i"] + 1) % iters

            sec = measure(step, iters, args.runs, mode.warm_passes, device)
        report.add(name, mode, fig, streams * tgt_len * iters, sec, iters,
                   "nll %.3f" % statistics.mean(state["loss"]))

    figure(report, name, mode, fig, run)


def bench_par_base(mt, cfg, mode, args, report):
    device, name = mode.device, "par-base"
    gen = seeded(args.seed)
    shape = dict(cfg["par"])
    seg = shape["mem_len"]
    model = par_class(mt)(tgt_len=seg, **shape)
    weights_init(model)
    model.to(device).eval()
    n_token = shape["n_token"]

    for streams, block, iters in cfg["par_score"]:
        model.reset_length(block, 0, shape["mem_len"])
        txl_score(model, mode, args, report, name, streams, iters, "", gen,
                  n_token)

    crit = model.crit

    def decode_step(x, *mems):
        hidden, new_mems = model._forward(x, mems=list(mems))
        logit = crit._compute_logit(hidden[-1], crit.out_layers[0].weight,
                                    crit.out_layers[0].bias,
                                    crit.out_projs[0])
        return logit.argmax(-1)[None, :], new_mems

    def decode(streams, iters):
        call = mode.wrap(decode_step)
        with torch.no_grad():
            prompt = torch.randint(0, n_token, (seg + 1, streams),
                                   generator=gen).to(device)
            _, mems = model._forward(prompt[:seg], mems=model.init_mems())
            state = dict(x=prompt[seg:], mems=mems)

            def step():
                state["x"], state["mems"] = call(state["x"], *state["mems"])

            model.reset_length(1, 0, shape["mem_len"])
            sec = measure(step, iters, args.runs, mode.warm_passes, device)
        report.add(name, mode, "decode %d" % streams, streams * iters, sec,
                   iters, "memory %d" % state["mems"][0].size(0))

    for streams, iters in cfg["par_decode"]:
        figure(report, name, mode, "decode %d" % streams,
               lambda: decode(streams, iters))


def bench_txl_wt103(mt, cfg, mode, args, report):
    name = "txl-wt103"
    gen = seeded(args.seed)
    s = cfg["txl"]
    cutoffs = list(s["cutoffs"])
    model = mt.MemTransformerLM(
        s["n_token"], s["n_layer"], s["n_head"], s["d_model"], s["d_head"],
        s["d_inner"], dropout=0.1, dropatt=0.0, tie_weight=True,
        d_embed=s["d_model"], div_val=1,
        tie_projs=[False] + [True] * len(cutoffs), pre_lnorm=False,
        tgt_len=s["tgt_len"], ext_len=0, mem_len=s["mem_len"],
        cutoffs=cutoffs, same_length=True, attn_type=0,
        clamp_len=s["clamp_len"], sample_softmax=-1)
    weights_init(model)
    model.to(mode.device).eval()
    # eval.py with run_wt103_base.sh's eval flags
    model.reset_length(s["tgt_len"], 0, s["mem_len"])
    model.clamp_len, model.same_length = s["clamp_len"], True
    for dist in ("uniform", "zipf"):
        for streams, iters in cfg["txl_score"]:
            txl_score(model, mode, args, report, name, streams, iters, dist,
                      gen, s["n_token"])


# --------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--mode", default="eager,compile",
                    help="eager, compile or both, comma-separated")
    ap.add_argument("--only", default=",".join(MODELS),
                    help="models, comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--runs", type=int, default=5,
                    help="timed runs a figure; the median is reported")
    ap.add_argument("--tiny", action="store_true",
                    help="tiny shapes, for a smoke test on the CPU")
    ap.add_argument("--adaptive-span", default=".dev/ref/adaptive-span")
    ap.add_argument("--transformer-xl", default=".dev/ref/transformer-xl")
    ap.add_argument("--span-profile",
                    default="../shared/bench/span-profile.json",
                    help="per-head spans (a copy is in this file)")
    ap.add_argument("--small-span-init", type=float, default=0.0,
                    help="aspan-small's --adapt-span-init (reference: 0)")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode (default: its default)")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    modes = [m for m in args.mode.split(",") if m]
    only = [m for m in args.only.split(",") if m]
    for m in modes:
        if m not in MODES:
            ap.error("--mode: %s is not one of %s" % (m, ", ".join(MODES)))
    for m in only:
        if m not in MODELS:
            ap.error("--only: %s is not one of %s" % (m, ", ".join(MODELS)))
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_ref: --device cuda but CUDA is not available")
    device = torch.device(args.device)
    cfg = TINY if args.tiny else FULL
    t_start = time.perf_counter()

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        card = torch.cuda.get_device_name(device)
        precision = "TF32 off (torch.backends.cuda.matmul.allow_tf32 = %s)" \
            % torch.backends.cuda.matmul.allow_tf32
    else:
        card = "CPU (%d threads)" % torch.get_num_threads()
        precision = "float32"
    print("bench_ref: %s, torch %s, eager: %s" % (card, torch.__version__,
                                                  precision))
    if "compile" in modes:
        for limit in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, limit):
                setattr(torch._dynamo.config, limit, 64)

    shims = []
    aspan = mt = None
    if any(m.startswith("aspan") for m in only):
        aspan = load_adaptive_span(args.adaptive_span, shims)
    if "par-base" in only or "txl-wt103" in only:
        mt = load_transformer_xl(args.transformer_xl, shims)
    print("shims: " + ("; ".join(shims) if shims else "none"))

    report = Report()
    for key in modes:
        mode = Mode(key, device, args.compile_mode)
        for name in only:
            t0 = time.perf_counter()
            try:
                if name == "aspan-enwik8":
                    bench_aspan_enwik8(aspan, cfg, mode, args, report)
                elif name == "aspan-small":
                    bench_aspan_small(aspan, cfg, mode, args, report)
                elif name == "par-base":
                    bench_par_base(mt, cfg, mode, args, report)
                else:
                    bench_txl_wt103(mt, cfg, mode, args, report)
            except Exception as err:  # noqa: BLE001 - reported
                report.fail(name, mode, "(build)", err)
            if key == "compile":
                torch._dynamo.reset()
            free(device)
            print("  (%s %s: %.1f s)" % (name, mode.name,
                                         time.perf_counter() - t0),
                  flush=True)

    print()
    print(report.table(modes))
    print()
    print("card: %s; torch %s; CUDA %s; %s%s; elapsed %.1f s" % (
        card, torch.__version__, torch.version.cuda, precision,
        "; --tiny shapes" if args.tiny else "",
        time.perf_counter() - t_start))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
