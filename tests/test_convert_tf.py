#!/usr/bin/env python3
"""test_convert_tf.py - the Python half of tests/test_convert_tf.sh:
TensorFlow checkpoints written as Jmkernes/PAR-Transformer-XL's train.py
writes them, and the checks of clients/convert's output against the
variables it came from.

  test_convert_tf.py build FIXTURE_DIR TMP
      TMP/opt/: the fixture's model variables in the seed's object graph
      (tf.Module objects at the same attribute paths: model/stoch_blks/0/
      rmha/W_emb/kernel, ffn/layer_with_weights-0, ...) saved through a
      CheckpointManager with a Keras Adam optimizer's slots (zero gradients
      applied: the values stay the fixture's), glob_step and a tf.data
      iterator, as tf.train.Checkpoint(model, optimizer, glob_step,
      iterator); ckpt-1 the fixture's values, ckpt-2 the same with block 5's
      pi made to pick the feed-forward branch; config.json and the .model
      beside them; TMP/opt/variables.txt lists ckpt-1's variables.
      TMP/nowpos/: the fixture's graph without block 2's rmha/W_pos/kernel.
      TMP/repo/checkpoints/train/dense/: a small random model with a plain
      Dense output layer (cutoffs null), a tie in one block's pi, its
      tokenizer in TMP/repo/tokenizer/.
  test_convert_tf.py check OUT PREFIX SPM SEQ_LEN [OUT PREFIX SPM SEQ_LEN ...]
      every tensor of OUT equals the variable of checkpoint PREFIX it came
      from (transposes and reorders undone), no tensor more or fewer than the
      blocks' argmax asks for, the config metadata as it must be from
      PREFIX's folder's config.json, the vocab metadata the SPM file's bytes.
  test_convert_tf.py same A B
      A and B hold the same tensors (names, dtypes, shapes, bytes), config
      and vocab.
  test_convert_tf.py shortspm SRC DST N
      DST: SRC's SentencePiece model with its first N pieces only.

build (which checks that ckpt-1 holds the fixture's values), check and same
print a FAIL line for each failed check and end with 'test_convert_tf.py: N
passed, N failed'.
"""
import base64
import json
import os
import shutil
import struct
import sys

import numpy as np

VV = "/.ATTRIBUTES/VARIABLE_VALUE"
SEED = "Jmkernes/PAR-Transformer-XL (TensorFlow) "
npass = nfail = 0


def check(ok, what):
    global npass, nfail
    if ok:
        npass += 1
    else:
        nfail += 1
        print("FAIL test_convert_tf.py: %s" % what)
    return ok


def counts():
    print("test_convert_tf.py: %d passed, %d failed" % (npass, nfail))
    return 1 if nfail else 0


def tf_module():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    return tf


def read_st(path):
    """(name -> (dtype, shape, array), config, vocab) of a safetensors file."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    m = h.pop("__metadata__")
    t = {}
    for k, x in h.items():
        lo, hi = x["data_offsets"]
        a = np.frombuffer(b[8 + n + lo:8 + n + hi], dtype="<f4" if x["dtype"] == "F32" else "u1")
        t[k] = (x["dtype"], x["shape"], a.reshape(x["shape"]) if x["dtype"] == "F32" else a)
    return t, json.loads(m["config"]), json.loads(m["vocab"])


# ------------------------------------------------------------ build

def module_tree(tf, values):
    """A tf.Module tree whose attribute paths are the variables' names
    (short name 'stoch_blks/0/rmha/W_emb/kernel' -> value)."""
    root = tf.Module()
    for name, v in values.items():
        parts = name.split("/")
        m = root
        for p in parts[:-1]:
            if not hasattr(m, p):
                setattr(m, p, tf.Module())
            m = getattr(m, p)
        setattr(m, parts[-1], tf.Variable(v, name=parts[-1]))
    return root


def model_values(tf, prefix):
    """short name -> value of a checkpoint's model/ variables (slots left out)."""
    r = tf.train.load_checkpoint(prefix)
    out = {}
    for k in sorted(r.get_variable_to_shape_map()):
        if k.startswith("model/") and k.endswith(VV) and ".OPTIMIZER_SLOT" not in k:
            out[k[len("model/"):-len(VV)]] = r.get_tensor(k)
    return out


def save_folder(tf, folder, values, cfg, spm, fx_step, saves=1, then=None):
    """values saved as the seed's train.py saves them, into folder."""
    os.makedirs(folder, exist_ok=True)
    model = module_tree(tf, values)
    variables = list(model.trainable_variables)
    opt = tf.keras.optimizers.legacy.Adam(1e-3)  # slots as .OPTIMIZER_SLOT, as train.py's era of Keras saved them
    opt.apply_gradients(zip([tf.zeros_like(v) for v in variables], variables))
    glob_step = tf.Variable(fx_step, dtype=tf.int64)
    iterator = iter(tf.data.Dataset.range(8).batch(2))
    next(iterator)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, glob_step=glob_step, iterator=iterator)
    mgr = tf.train.CheckpointManager(ckpt, folder, max_to_keep=5)
    mgr.save()
    if then is not None:
        then(model)
        mgr.save()
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    if spm:
        shutil.copy(spm, folder)
    return model


def build(fxdir, tmp):
    tf = tf_module()
    prefix = os.path.join(fxdir, "checkpoint", "ckpt-1")
    with open(os.path.join(fxdir, "checkpoint", "config.json")) as f:
        cfg = json.load(f)
    spm = os.path.join(fxdir, "wiki2_12k.model")
    values = model_values(tf, prefix)
    step = int(tf.train.load_checkpoint(prefix).get_tensor("glob_step" + VV))
    before = {k: np.array(v) for k, v in values.items()}

    def pick_ffn(model):
        getattr(model.stoch_blks, "5").pi.assign([0.1, 0.7, 0.2])
    save_folder(tf, os.path.join(tmp, "opt"), values, cfg, spm, step, then=pick_ffn)
    saved = model_values(tf, os.path.join(tmp, "opt", "ckpt-1"))
    check(sorted(saved) == sorted(before) and all(np.array_equal(saved[k], before[k]) for k in before),
          "%s/opt/ckpt-1 does not hold the fixture's model variables (zero gradients changed them?)" % tmp)
    r = tf.train.load_checkpoint(os.path.join(tmp, "opt", "ckpt-1"))
    with open(os.path.join(tmp, "opt", "variables.txt"), "w") as f:
        for k, s in sorted(r.get_variable_to_shape_map().items()):
            f.write("%s %s\n" % (k, s))
    # the graph without one attention block's W_pos kernel
    nowpos = {k: v for k, v in values.items() if k != "stoch_blks/2/rmha/W_pos/kernel"}
    save_folder(tf, os.path.join(tmp, "nowpos"), nowpos, cfg, spm, step)
    # a small model with a Dense output layer; block 0's pi ties attn and ffn (the first wins)
    rng = np.random.default_rng(4)
    D, K, I, L, V = 16, 2, 24, 3, cfg["vocab_size"]
    dcfg = dict(cfg, d_model=D, num_heads=K, d_ffn=I, num_layers=L, mem_len=8, cutoffs=None, proj_dims=None,
                straight_through=True)
    dv = {"embed/embeddings": rng.standard_normal((V, D)), "final_layer/kernel": rng.standard_normal((D, V)),
          "final_layer/bias": rng.standard_normal(V)}
    pis = ([0.4, 0.4, 0.2], [0.2, 0.5, 0.3], [0.1, 0.2, 0.7])
    for b in range(L):
        p = "stoch_blks/%d/" % b
        dv[p + "pi"] = np.array(pis[b])
        dv[p + "tau"] = np.array(1.0)
        for k, s in (("rmha/W_emb/kernel", (D, 3 * D)), ("rmha/W_emb/bias", (3 * D,)), ("rmha/W_pos/kernel", (D, D)),
                     ("rmha/W_pos/bias", (D,)), ("rmha/dense/kernel", (D, D)), ("rmha/dense/bias", (D,)),
                     ("rmha/global_content_bias", (1, K, 1, D // K)), ("rmha/global_position_bias", (1, K, 1, D // K)),
                     ("layernorm_mha/gamma", (D,)), ("layernorm_mha/beta", (D,)),
                     ("ffn/layer_with_weights-0/kernel", (D, I)), ("ffn/layer_with_weights-0/bias", (I,)),
                     ("ffn/layer_with_weights-1/kernel", (I, D)), ("ffn/layer_with_weights-1/bias", (D,)),
                     ("layernorm_ffn/gamma", (D,)), ("layernorm_ffn/beta", (D,))):
            dv[p + k] = rng.standard_normal(s)
    dv = {k: np.asarray(v, dtype=np.float32) for k, v in dv.items()}
    repo = os.path.join(tmp, "repo")
    save_folder(tf, os.path.join(repo, "checkpoints", "train", "dense"), dv, dcfg, None, 7)
    os.makedirs(os.path.join(repo, "tokenizer"), exist_ok=True)
    shutil.copy(spm, os.path.join(repo, "tokenizer"))
    return counts()


# ------------------------------------------------------------ check

def check_one(tf, out, prefix, spm, seq_len):
    name = os.path.basename(out)
    with open(os.path.join(os.path.dirname(prefix), "config.json")) as f:
        cfg = json.load(f)
    r = tf.train.load_checkpoint(prefix)

    def var(k):
        return np.asarray(r.get_tensor("model/" + k + VV))
    t, c, v = read_st(out)
    D, K, L = cfg["d_model"], cfg["num_heads"], cfg["num_layers"]
    dh = D // K
    cut = sorted(cfg["cutoffs"] or [])
    n = len(cut) - 1 if cut else 0
    arch = [("attn", "ffn", "skip")[int(np.argmax(var("stoch_blks/%d/pi" % b)))] for b in range(L)]
    pf = cfg.get("proj_factor", 4)
    proj = [cfg["proj_dims"][k - 1] if cfg.get("proj_dims") else int(max(D / pf ** k, 1)) for k in range(1, n + 1)]
    want_c = {"family": "par-transformer-xl-tf", "tokenizer": "sentencepiece", "vocab_size": cfg["vocab_size"],
              "d_model": D, "n_head": K, "d_head": dh, "d_inner": cfg["d_ffn"], "n_blocks": L,
              "mem_len": cfg["mem_len"], "tgt_len": seq_len, "max_position": cfg["max_position"],
              "cutoffs": cut[:-1], "proj_dims": proj, "arch": arch,
              "straight_through": cfg.get("straight_through", False), "source": SEED + os.path.basename(prefix)}
    check(c == want_c, "%s: config %s, expected %s" % (name, json.dumps(c), json.dumps(want_c)))
    with open(spm, "rb") as f:
        model = f.read()
    check(set(v) == {"sentencepiece"} and base64.b64decode(v["sentencepiece"], validate=True) == model,
          "%s: vocab is not {\"sentencepiece\": base64 of %s}" % (name, spm))
    # each written tensor -> the variable it must be once its layout is undone
    want = {"emb.weight": ("embed/embeddings", lambda x: x)}
    T = lambda x: x.T  # noqa: E731
    for b in range(L):
        p, o = "stoch_blks/%d/" % b, "blocks.%d." % b
        want[o + "pi"] = (p + "pi", lambda x: x)
        if arch[b] == "attn":
            # qkv_net rows Q, K, V back to the kernel's columns Q, V, K
            want[o + "attn.qkv_net.weight"] = (p + "rmha/W_emb/kernel",
                                               lambda x: np.concatenate([x[:D], x[2 * D:], x[D:2 * D]]).T)
            want[o + "attn.qkv_net.bias"] = (p + "rmha/W_emb/bias",
                                             lambda x: np.concatenate([x[:D], x[2 * D:], x[D:2 * D]]))
            want[o + "attn.r_net.weight"] = (p + "rmha/W_pos/kernel", T)
            want[o + "attn.r_net.bias"] = (p + "rmha/W_pos/bias", lambda x: x)
            # [K, d_head] from [1, K, 1, d_head]
            want[o + "attn.r_w_bias"] = (p + "rmha/global_content_bias",
                                         lambda x: x.reshape(1, K, 1, dh) if x.shape == (K, dh) else x.ravel())
            want[o + "attn.r_r_bias"] = (p + "rmha/global_position_bias",
                                         lambda x: x.reshape(1, K, 1, dh) if x.shape == (K, dh) else x.ravel())
            want[o + "attn.o_net.weight"] = (p + "rmha/dense/kernel", T)
            want[o + "attn.o_net.bias"] = (p + "rmha/dense/bias", lambda x: x)
            want[o + "attn.layer_norm.weight"] = (p + "layernorm_mha/gamma", lambda x: x)
            want[o + "attn.layer_norm.bias"] = (p + "layernorm_mha/beta", lambda x: x)
        elif arch[b] == "ffn":
            want[o + "ff.CoreNet.0.weight"] = (p + "ffn/layer_with_weights-0/kernel", T)
            want[o + "ff.CoreNet.0.bias"] = (p + "ffn/layer_with_weights-0/bias", lambda x: x)
            want[o + "ff.CoreNet.3.weight"] = (p + "ffn/layer_with_weights-1/kernel", T)
            want[o + "ff.CoreNet.3.bias"] = (p + "ffn/layer_with_weights-1/bias", lambda x: x)
            want[o + "ff.layer_norm.weight"] = (p + "layernorm_ffn/gamma", lambda x: x)
            want[o + "ff.layer_norm.bias"] = (p + "layernorm_ffn/beta", lambda x: x)
    part = {}  # the part of the variable a tensor holds (the head's columns)
    if n:
        c0 = cut[0]
        # the head: c0 shortlist columns, then n cluster columns in the seed's order (the rows reversed here)
        want["crit.out_layers.0.weight"] = ("final_layer/head_w/kernel", T)
        want["crit.out_layers.0.bias"] = ("final_layer/head_w/bias", lambda x: x)
        want["crit.cluster_weight"] = ("final_layer/head_w/kernel", lambda x: x[::-1].T)
        want["crit.cluster_bias"] = ("final_layer/head_w/bias", lambda x: x[::-1])
        part = {"crit.out_layers.0.weight": lambda x: x[:, :c0], "crit.out_layers.0.bias": lambda x: x[:c0],
                "crit.cluster_weight": lambda x: x[:, c0:], "crit.cluster_bias": lambda x: x[c0:]}
        for k in range(1, n + 1):
            q = "final_layer/tail_w/%d/" % (k - 1)
            want["crit.out_projs.%d" % k] = (q + "layer_with_weights-0/kernel", lambda x: x)
            want["crit.out_projs_bias.%d" % k] = (q + "layer_with_weights-0/bias", lambda x: x)
            want["crit.out_layers.%d.weight" % k] = (q + "layer_with_weights-1/kernel", T)
            want["crit.out_layers.%d.bias" % k] = (q + "layer_with_weights-1/bias", lambda x: x)
    else:
        want["out.weight"] = ("final_layer/kernel", T)
        want["out.bias"] = ("final_layer/bias", lambda x: x)
    check(set(t) == set(want), "%s: tensors %s more, %s fewer than expected"
          % (name, sorted(set(t) - set(want))[:6], sorted(set(want) - set(t))[:6]))
    for k in sorted(set(t) & set(want)):
        src, undo = want[k]
        dt, shape, a = t[k]
        if not check(dt == "F32", "%s: %s is %s, not F32" % (name, k, dt)):
            continue
        full, got = part.get(k, lambda x: x)(var(src)), undo(a)
        check(got.shape == full.shape and np.array_equal(got, full.astype(np.float32)),
              "%s: %s %s does not undo to %s %s%s" % (name, k, shape, src, list(full.shape),
                                                     " (a part of it)" if k in part else ""))


def check_all(args):
    if not args or len(args) % 4:
        sys.exit("usage: test_convert_tf.py check OUT PREFIX SPM SEQ_LEN [...]")
    tf = tf_module()
    for i in range(0, len(args), 4):
        out, prefix, spm, seq_len = args[i:i + 4]
        if check(os.path.isfile(out), "%s was not written" % out):
            check_one(tf, out, prefix, spm, int(seq_len))
    return counts()


def same(a, b):
    ta, ca, va = read_st(a)
    tb, cb, vb = read_st(b)
    diff = sorted(k for k in set(ta) | set(tb) if k not in ta or k not in tb or ta[k][:2] != tb[k][:2]
                  or ta[k][2].tobytes() != tb[k][2].tobytes())
    check(ta and not diff, "%s differs from %s in tensors %s" % (b, a, diff[:6]))
    check(ca == cb, "%s: config %s, %s's %s" % (b, json.dumps(cb), a, json.dumps(ca)))
    check(va == vb, "%s: vocab differs from %s's" % (b, a))
    return counts()


def short_spm(src, dst, keep):
    """Top-level ModelProto fields copied, field 1 (pieces) only `keep` times."""
    with open(src, "rb") as f:
        d = f.read()

    def varint(i):
        v = s = 0
        while True:
            c = d[i]
            i += 1
            v |= (c & 0x7f) << s
            s += 7
            if c < 0x80:
                return v, i
    out, i, seen = bytearray(), 0, 0
    while i < len(d):
        start = i
        key, i = varint(i)
        wire = key & 7
        if wire == 0:
            _, i = varint(i)
        elif wire == 1:
            i += 8
        elif wire == 2:
            ln, i = varint(i)
            i += ln
        elif wire == 5:
            i += 4
        if key >> 3 == 1:
            seen += 1
            if seen > keep:
                continue
        out += d[start:i]
    with open(dst, "wb") as f:
        f.write(bytes(out))
    return 0


if __name__ == "__main__":
    cmd, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if cmd == "build" and len(args) == 2:
        sys.exit(build(*args))
    if cmd == "check":
        sys.exit(check_all(args))
    if cmd == "same" and len(args) == 2:
        sys.exit(same(*args))
    if cmd == "shortspm" and len(args) == 3:
        sys.exit(short_spm(args[0], args[1], int(args[2])))
    sys.exit(__doc__)
