#!/usr/bin/env python3
"""
test_par_tf.py - seed 004's TensorFlow PAR Transformer-XL (family
par-transformer-xl-tf, SentencePiece pieces) served by the real server over
real HTTP.

Always (a fresh clone too): small random models of the family on the
committed tokenizer tests/fixtures/tiny-spm.model (byte fallback, no
normalization), written here: the model's report and spans (pi, the chosen
kinds), the library's segmentation and byte offsets (the ids and offsets the
`sentencepiece` package gives, hard-coded below), scoring, a session fed in
chunks that add up to the whole when they feed whole segments, generation
(plain, seeded, streamed: the text is its pieces), completions with echo and
logprobs, chat, a session's state exported and imported, invalid UTF-8, and
the loader's refusals (a vocabulary that is not a SentencePiece model, a
piece count against vocab_size, pi against arch, a segment past
max_position, a missing tensor).

With the seed's checkpoint converted (tests/convert_fixtures.sh, in make test
where tensorflow is installed: $SPANSERVE_CONVERTED/par-tf.safetensors) and
../shared/fixtures/par-tf: the spans report's pi and arch, the validation
text's nll over 34,953 predictions against the seed's val_nll_full_eval, a
session fed line-aligned chunks of whole segments equal to the whole, and
completions' pieces at their offsets in the prompt. SKIP lines say what is
missing. Ends with `test_par_tf.py: N passed, N failed`.
"""
import base64
import json
import math
import os
import random
import struct
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_api as T  # noqa: E402
from test_api import Server, check, sse_events  # noqa: E402

SPM = os.path.join(T.ROOT, "tests", "fixtures", "tiny-spm.model")
CONVERTED = os.path.join(os.environ.get("SPANSERVE_CONVERTED", os.path.join(T.ROOT, "build", "fixtures")),
                         "par-tf.safetensors")
FIXDIR = os.path.join(T.SHARED, "fixtures", "par-tf")

# What the `sentencepiece` package (0.1.99) makes of these two lines with
# tiny-spm.model: (id, the character where the piece begins). The server must
# give the same ids (through the C++ library) and the same places in bytes.
LINE1 = "ROMEO: H\u00e9llo \U0001F642 there"
LINE2 = "my lord!"
SEG1 = [(260, 0), (366, 0), (330, 1), (376, 2), (378, 3), (330, 4), (266, 5), (260, 6), (373, 7), (199, 8), (173, 8),
        (312, 9), (268, 11), (260, 12), (244, 13), (163, 13), (157, 13), (134, 13), (270, 14), (293, 18)]
SEG2 = [(296, 0), (260, 2), (280, 3), (311, 4), (264, 6), (306, 7)]


def write_st(path, tensors, meta):
    """A safetensors file of float32 TENSORS ({name: (shape, flat list)}) and METADATA."""
    head, blobs, off = {"__metadata__": meta}, [], 0
    for name, (shape, vals) in tensors.items():
        b = struct.pack("<%df" % len(vals), *vals)
        head[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(head).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def tiny_model(path, seed=1, arch=("attn", "ffn", "attn", "skip"), D=32, K=2, I=64, V=400, mem_len=8, tgt_len=16,
               max_position=64, cutoffs=(100, 250), proj_dims=(8, 2), spm_bytes=None, config_over=None, drop=None,
               pi_over=None):
    """A random par-transformer-xl-tf model as clients/convert writes one."""
    rnd = random.Random(seed)

    def w(*shape, scale=0.2):
        n = 1
        for s in shape:
            n *= s
        return (shape, [rnd.gauss(0, scale) for _ in range(n)])

    def ones(n):
        return ((n,), [1.0 + rnd.gauss(0, 0.05) for _ in range(n)])

    t = {"emb.weight": w(V, D, scale=0.5)}
    for b, kind in enumerate(arch):
        k = ["attn", "ffn", "skip"].index(kind)
        t[f"blocks.{b}.pi"] = ((3,), pi_over[b] if pi_over and b in pi_over else [0.7 if i == k else 0.15 for i in range(3)])
        if kind == "attn":
            p = f"blocks.{b}.attn."
            t.update({p + "qkv_net.weight": w(3 * D, D), p + "qkv_net.bias": w(3 * D, scale=0.05),
                      p + "r_net.weight": w(D, D), p + "r_net.bias": w(D, scale=0.05),
                      p + "r_w_bias": w(K, D // K, scale=0.1), p + "r_r_bias": w(K, D // K, scale=0.1),
                      p + "o_net.weight": w(D, D), p + "o_net.bias": w(D, scale=0.05),
                      p + "layer_norm.weight": ones(D), p + "layer_norm.bias": w(D, scale=0.05)})
        elif kind == "ffn":
            p = f"blocks.{b}.ff."
            t.update({p + "CoreNet.0.weight": w(I, D), p + "CoreNet.0.bias": w(I, scale=0.05),
                      p + "CoreNet.3.weight": w(D, I), p + "CoreNet.3.bias": w(D, scale=0.05),
                      p + "layer_norm.weight": ones(D), p + "layer_norm.bias": w(D, scale=0.05)})
    # cutoffs as the converter writes them: the starts of the n tail clusters (the seed's list without V)
    cuts, n = list(cutoffs) + [V], len(cutoffs)
    if cutoffs:
        t["crit.out_layers.0.weight"] = w(cuts[0], D)
        t["crit.out_layers.0.bias"] = w(cuts[0], scale=0.1)
        t["crit.cluster_weight"] = w(n, D)
        t["crit.cluster_bias"] = w(n, scale=0.1)
        for k in range(1, n + 1):
            t[f"crit.out_projs.{k}"] = w(D, proj_dims[k - 1])
            t[f"crit.out_projs_bias.{k}"] = w(proj_dims[k - 1], scale=0.1)
            t[f"crit.out_layers.{k}.weight"] = w(cuts[k] - cuts[k - 1], proj_dims[k - 1], scale=0.5)
            t[f"crit.out_layers.{k}.bias"] = w(cuts[k] - cuts[k - 1], scale=0.1)
    else:
        t["out.weight"] = w(V, D)
        t["out.bias"] = w(V, scale=0.1)
    for name in drop or ():
        del t[name]
    cfg = {"family": "par-transformer-xl-tf", "tokenizer": "sentencepiece", "vocab_size": V, "d_model": D,
           "n_head": K, "d_head": D // K, "d_inner": I, "n_blocks": len(arch), "mem_len": mem_len, "tgt_len": tgt_len,
           "max_position": max_position, "cutoffs": list(cutoffs), "proj_dims": list(proj_dims), "arch": list(arch)}
    cfg.update(config_over or {})
    if spm_bytes is None:
        spm_bytes = open(SPM, "rb").read()
    vocab = spm_bytes if isinstance(spm_bytes, str) else json.dumps({"sentencepiece": base64.b64encode(spm_bytes).decode()})
    write_st(path, t, {"config": json.dumps(cfg), "vocab": vocab})


def main():
    if not os.path.exists(SPM):
        print(f"SKIP test_par_tf.py: no {SPM}")
        print("test_par_tf.py: 0 passed, 0 failed")
        return 0
    S = Server("par-tf", extra=os.environ.get("SPANSERVE_SERVE_ARGS", "").split())
    tiny = os.path.join(S.tmp, "tiny.safetensors")
    tiny_model(tiny)
    S.extra = ["--model", f"t={tiny}"] + S.extra
    have_fix = os.path.exists(CONVERTED) and os.path.isdir(FIXDIR)
    if have_fix:
        S.extra = ["--model", f"p={CONVERTED}"] + S.extra
    T.CURRENT = "par-tf"
    err = S.start()
    check("server starts with par-transformer-xl-tf models", err is None, f"{err}")
    if err:
        print(f"test_par_tf.py: {T.PASS} passed, {T.FAIL} failed")
        return 1
    try:
        run_tiny(S)
        load_errors(S)
        if have_fix:
            run_fixture(S)
        else:
            why = f"no {CONVERTED} (tests/convert_fixtures.sh converts the seed's checkpoint in make test where " \
                  "tensorflow is installed: pip install tensorflow-cpu==2.15.1)" if os.path.isdir(FIXDIR) else \
                  f"no {FIXDIR} (set SPANSERVE_SHARED; CI has it)"
            print(f"SKIP test_par_tf.py seed checkpoint: {why}")
    finally:
        T.finish(S)
    print(f"test_par_tf.py: {T.PASS} passed, {T.FAIL} failed")
    return 1 if T.FAIL else 0


def byte_offsets(line, seg, base=0):
    return [base + len(line[:c].encode()) for _, c in seg]


def run_tiny(S):
    T.CURRENT = "tiny"
    r = S.call("GET", "/v1/models/t")
    j = r.json or {}
    check("GET /v1/models/t: family, tokenizer, sizes", r.status == 200 and j.get("family") == "par-transformer-xl-tf"
          and j.get("tokenizer") == "sentencepiece" and j.get("vocab_size") == 400 and j.get("block_len") == 16, f"{r}")
    # keys and values of 8 rows in each of the 2 attention blocks, 32 floats a row
    check("bytes per session", (j.get("memory") or {}).get("bytes_per_stream") == 2 * 2 * 8 * 32 * 4, f"{j.get('memory')}")
    if "cuda" in os.environ.get("SPANSERVE_SERVE_ARGS", ""):
        check("served by the GPU", j.get("device") not in (None, "cpu"), f"{j.get('device')}")
    r = S.call("GET", "/v1/models/t/spans")
    j = r.json or {}
    blocks = j.get("blocks") or []
    check("spans: kinds and pi", r.status == 200 and [b.get("kind") for b in blocks] == ["attn", "ffn", "attn", "skip"]
          and all(abs((b.get("pi") or {}).get(b["kind"], 0) - 0.7) < 1e-6 for b in blocks)
          and j.get("max_position") == 64 and j.get("mem_len") == 8, f"{r}")
    r = S.call("GET", "/v1/models/t/spans?format=svg")
    ok = r.status == 200
    try:
        ET.fromstring(r.body)
    except ET.ParseError:
        ok = False
    check("spans: the picture draws pi", ok and b"pi(attn)" in r.body, f"{r.status}")

    T.CURRENT = "tiny tokens"
    text = LINE1 + "\n" + LINE2
    r = S.call("POST", "/v1/completions", {"model": "t", "prompt": text, "max_tokens": 1, "echo": True, "logprobs": 1,
                                            "seed": 1})
    lp = ((r.json or {}).get("choices") or [{}])[0].get("logprobs") or {}
    offs = lp.get("text_offset") or []
    want = byte_offsets(LINE1, SEG1) + byte_offsets(LINE2, SEG2, len(LINE1.encode()) + 1)
    check("the library's segmentation: each line alone, byte offsets in the prompt", r.status == 200
          and offs[:len(want)] == want, f"{offs} vs {want}")
    sc = S.call("POST", "/v1/score", {"model": "t", "text": text, "per_token": True})
    j = sc.json or {}
    check("score: every piece after the first predicted once, no bpc", sc.status == 200
          and j.get("tokens") == len(SEG1) + len(SEG2) - 1 and "bpc" not in j
          and len(j.get("token_logprobs") or []) == j.get("tokens"), f"{sc}")
    got = lp.get("token_logprobs", [None])[1:len(want)]
    check("echo's logprobs are the score's", len(got) == len(want) - 1 and all(
        abs(a - b) < 1e-5 for a, b in zip(got, j.get("token_logprobs") or [])), f"{got} {j.get('token_logprobs')}")
    pieces = lp.get("tokens") or []
    check("pieces: a space for the word boundary, none at the start, bytes of a character as U+FFFD",
          pieces[:3] == ["", "R", "O"] and pieces[7:10] == [" ", "H", "\ufffd"] and pieces[18] == " the", f"{pieces}")
    bad = T.call(S.port, "POST", "/v1/score", b'{"model":"t","text":"ok \\udcff"}', ctype="application/json")
    check("a lone surrogate is refused with 400", bad.status == 400, f"{bad}")
    r = S.call("POST", "/v1/score", {"model": "t", "text": "a\tb c\n\n\nd\ud83d\ude42\u00e9\r\n", "per_token": True})
    check("tabs, empty lines, CR and characters outside the pieces score", r.status == 200
          and (r.json or {}).get("tokens", 0) >= 5, f"{r}")

    T.CURRENT = "tiny session"
    # lines 0..12 of the text are 129 pieces (8 segments of 16 inputs and one pending), 13..49 are 672 (42
    # segments): fed in two requests they are the same segments as the whole text at once
    lines = T.TEXT.split("\n")
    A, B = "\n".join(lines[:13]) + "\n", "\n".join(lines[13:50]) + "\n"
    r = S.call("POST", "/v1/sessions", {"model": "t", "id": "ts"})
    r1 = S.call("POST", "/v1/score", {"session": "ts", "text": A, "per_token": True})
    r2 = S.call("POST", "/v1/score", {"session": "ts", "text": B, "per_token": True})
    rw = S.call("POST", "/v1/score", {"model": "t", "text": A + B, "per_token": True})
    l1, l2 = (r1.json or {}).get("token_logprobs") or [], (r2.json or {}).get("token_logprobs") or []
    lw = (rw.json or {}).get("token_logprobs") or []
    worst = max((abs(x - y) for x, y in zip(l1 + l2, lw)), default=1)
    check("session: chunks of whole segments at line ends add up to the whole", r.status == 201 and len(l1) == 128
          and len(l1) + len(l2) == len(lw) == 128 + 672 and worst <= 1e-5, f"{len(l1)} + {len(l2)} vs {len(lw)}: {worst}")
    # one line fewer in the first chunk: other segments, other positions (the rule is not idle)
    S.call("POST", "/v1/sessions", {"model": "t", "id": "ts2"})
    A2, B2 = "\n".join(lines[:12]) + "\n", "\n".join(lines[12:50]) + "\n"
    m1 = (S.call("POST", "/v1/score", {"session": "ts2", "text": A2, "per_token": True}).json or {}).get("token_logprobs") or []
    m2 = (S.call("POST", "/v1/score", {"session": "ts2", "text": B2, "per_token": True}).json or {}).get("token_logprobs") or []
    check("session: chunks of other lengths predict each piece once, from other segments",
          len(m1) + len(m2) == len(lw) and max(abs(x - y) for x, y in zip(m1 + m2, lw)) > 1e-4, f"{len(m1)} {len(m2)}")

    T.CURRENT = "tiny generate"
    body = {"model": "t", "prompt": "KING RICHARD III:\n", "max_tokens": 24, "seed": 7, "temperature": 0.9}
    r = S.call("POST", "/v1/generate", body)
    j = r.json or {}
    gtext, gtoks = j.get("text", ""), j.get("tokens") or []
    check("generate: 24 pieces", r.status == 200 and len(gtoks) == 24 and all(0 <= t < 400 for t in gtoks), f"{r}")
    r2 = S.call("POST", "/v1/generate", body)
    check("generate: a seed repeats", (r2.json or {}).get("tokens") == gtoks and (r2.json or {}).get("text") == gtext,
          f"{r2}")
    r3 = S.call("POST", "/v1/generate", dict(body, stream=True))
    toks = [json.loads(d) for e, d in sse_events(r3.body or b"") if e == "token"]
    check("generate: streamed pieces make the text", r3.status == 200 and "".join(t["text"] for t in toks) == gtext
          and [t["token"] for t in toks] == gtoks, f"{r3.status} {len(toks)}")
    r = S.call("POST", "/v1/generate", {"session": "ts", "max_tokens": 5, "seed": 3})
    check("generate in a session", r.status == 200 and len((r.json or {}).get("tokens", [])) == 5, f"{r}")
    r = S.call("POST", "/v1/completions", {"model": "t", "prompt": "my lord", "max_tokens": 6, "echo": True,
                                            "logprobs": 2, "seed": 5})
    ch = ((r.json or {}).get("choices") or [{}])[0]
    lp = ch.get("logprobs") or {}
    ctext, ct, co = ch.get("text", ""), lp.get("tokens") or [], lp.get("text_offset") or []
    ok = r.status == 200 and ctext.startswith("my lord") and len(ct) == len(co)
    tail = ctext.encode()
    for t, o in zip(ct[len(SEG2) - 2:], co[len(SEG2) - 2:]):
        ok = ok and (t == "\ufffd" or tail[o:o + len(t.encode())] == t.encode())
    check("completions: generated pieces at their byte offsets in the answer", ok, f"{ct} {co} {ctext!r}")
    r = S.call("POST", "/v1/chat/completions", {"model": "t", "max_tokens": 8, "seed": 2,
                                                 "messages": [{"role": "user", "content": "What say you?"}]})
    msg = (((r.json or {}).get("choices") or [{}])[0].get("message") or {})
    check("chat", r.status == 200 and isinstance(msg.get("content"), str), f"{r}")

    T.CURRENT = "tiny state"
    r = S.call("GET", "/v1/sessions/ts/state")
    check("a session's state exports", r.status == 200 and len(r.body) > 2 * 2 * 8 * 32 * 4, f"{r.status}")
    r = S.call("PUT", "/v1/sessions/ts3/state?model=t", r.body, ctype="application/octet-stream")
    check("and imports", r.status in (200, 201), f"{r}")
    a = S.call("POST", "/v1/score", {"session": "ts", "text": "the king\n", "per_token": True})
    b = S.call("POST", "/v1/score", {"session": "ts3", "text": "the king\n", "per_token": True})
    check("the imported session continues as the original", a.status == 200
          and (a.json or {}).get("token_logprobs") == (b.json or {}).get("token_logprobs"), f"{a} {b}")

    T.CURRENT = "tiny attention"
    # the seed's attention as recorded: each row a softmax over the memory and the segment up to the query
    r = S.call("POST", "/v1/attention", {"model": "t", "text": "\n".join(T.TEXT.split("\n")[:3]), "layer": 2,
                                          "top_k": 64})
    j = r.json or {}
    rows = [row for h in j.get("heads") or [] for row in h.get("rows") or []]
    ok = r.status == 200 and len(j.get("heads") or []) == 2 and rows
    for row in rows:
        ok = ok and abs(row.get("sum", 0) - 1) < 1e-5 and abs(sum(row.get("weights") or []) - 1) < 1e-5 \
            and len(row.get("weights") or []) == (8 if row["query"] >= 16 else 0) + row["query"] % 16 + 1
    check("attention: block 2's two heads, each row a softmax over memory and segment", ok, f"{r.status} {str(j)[:300]}")
    r = S.call("POST", "/v1/attention", {"model": "t", "text": "my lord", "layer": 1})
    check("attention: a feed-forward block is refused naming the attention blocks", r.status == 400
          and "0" in ((r.json or {}).get("error") or {}).get("message", ""), f"{r}")

    # a model without cutoffs (one output layer), mem_len 0, another head count: loads and serves
    path = os.path.join(S.model_dir, "plain.safetensors")
    tiny_model(path, seed=3, arch=("ffn", "attn", "attn"), K=4, mem_len=0, cutoffs=(), proj_dims=())
    r = S.call("POST", "/v1/models", {"name": "plain", "path": "plain.safetensors"})
    check("a model with one output layer and no memory loads", r.status == 201, f"{r}")
    r = S.call("POST", "/v1/score", {"model": "plain", "text": text})
    check("and scores", r.status == 200 and (r.json or {}).get("tokens") == len(SEG1) + len(SEG2) - 1, f"{r}")


def load_errors(S):
    T.CURRENT = "load errors"
    spm = open(SPM, "rb").read()
    def varint(n):
        out = b""
        while True:
            out += bytes([n & 0x7F | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out
    # the tokenizer with one more piece (a user-defined symbol of 2,000 bytes) appended to ModelProto.pieces
    piece = b"\x0a" + varint(2000) + b"x" * 2000 + b"\x15" + struct.pack("<f", 0.0) + b"\x18\x04"
    long_piece = spm + b"\x0a" + varint(len(piece)) + piece
    cases = [
        ("a piece of 2,000 bytes", {"V": 401, "cutoffs": (100, 251), "spm_bytes": long_piece},
         "piece 400 is 2000 bytes long: at most 1024"),
        ("not base64", {"spm_bytes": json.dumps({"sentencepiece": "not base64!"})}, "not standard base64"),
        ("not a model", {"spm_bytes": b"\x0a\x03abc" * 40}, "SentencePiece"),
        ("an array", {"spm_bytes": json.dumps(["a", "b"])}, "a SentencePiece vocab must be the JSON object"),
        ("piece count", {"V": 401, "cutoffs": (100, 251), "spm_bytes": spm}, "vocab_size 401 but the vocabulary lists 400"),
        ("pi against arch", {"pi_over": {1: [0.1, 0.2, 0.7]}}, "config arch[1] is ffn but blocks.1.pi"),
        ("max_position", {"max_position": 20}, "tgt_len 16 + mem_len 8 is over max_position 20"),
        ("missing tensor", {"drop": ["blocks.2.attn.r_net.bias"]}, "blocks.2.attn.r_net.bias"),
        ("proj_dims", {"config_over": {"proj_dims": [8]}}, "proj_dims has 1 entries"),
    ]
    for label, kw, msg in cases:
        path = os.path.join(S.model_dir, "bad.safetensors")
        tiny_model(path, **kw)
        r = S.call("POST", "/v1/models", {"name": "bad", "path": "bad.safetensors"})
        m = ((r.json or {}).get("error") or {}).get("message", "")
        check(f"a model with {label}: 400 naming it", r.status in (400, 422) and msg in m, f"{r.status} {m}")
    r = S.call("GET", "/v1/models/bad")
    check("no refused model was loaded", r.status == 404, f"{r}")


def run_fixture(S):
    T.CURRENT = "seed"
    expected = json.load(open(os.path.join(FIXDIR, "expected.json")))
    r = S.call("GET", "/v1/models/p/spans")
    j = r.json or {}
    blocks = j.get("blocks") or []
    pis = [[(b.get("pi") or {}).get(k) for k in ("attn", "ffn", "skip")] for b in blocks]
    check("spans: the seed's arch and pi", r.status == 200 and [b.get("kind") for b in blocks] == expected["arch"]
          and all(abs(a - b) < 1e-6 for x, y in zip(pis, expected["pi"]) for a, b in zip(x, y))
          and j.get("tokenizer") == "sentencepiece", f"{r}")
    prec = (S.call("GET", "/v1/models/p").json or {}).get("precision", "fp32")
    text = T.TEXT[int(0.9 * len(T.TEXT)):]
    r = S.call("POST", "/v1/score", {"model": "p", "text": text}, timeout=300)
    j = r.json or {}
    ref = expected["val_nll_full_eval"]
    tol = 1e-4 if prec == "fp32" else 2e-2
    check(f"validation text: {expected['val_tokens_scored']} predictions, nll the seed's ({tol:g} relative, {prec})",
          r.status == 200 and j.get("tokens") == expected["val_tokens_scored"]
          and abs(j.get("nll", 0) - ref) <= tol * ref and math.isclose(j.get("ppl", 0), math.exp(j.get("nll", 0)),
                                                                        rel_tol=1e-5), f"{j} vs {ref}")
    # the command line: spanserve score --json over the same text prints the tokens and ppl
    import subprocess
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    try:
        p = subprocess.run([T.BIN, "score", "--json", "--device", "cpu", "--model", CONVERTED, f.name],
                           capture_output=True, text=True, timeout=300)
        c = json.loads(p.stdout or "{}")
        check("spanserve score --json: the seed's predictions and perplexity (1e-4 relative)", p.returncode == 0
              and c.get("tokens") == expected["val_tokens_scored"] and "bpc" not in c
              and abs(c.get("ppl", 0) - expected["val_ppl_full_eval"]) <= 1e-4 * expected["val_ppl_full_eval"]
              and abs(c.get("nll", 0) - ref) <= 1e-4 * ref, f"{p.returncode} {p.stdout} {p.stderr[-300:]}")
    finally:
        os.unlink(f.name)
    # chunks at line ends, each feeding whole segments of 32: per-line piece counts from the server
    lines = text.split("\n")[:120]
    counts = []
    for line in lines:
        c = (S.call("POST", "/v1/completions", {"model": "p", "prompt": line or " ", "max_tokens": 1, "echo": True,
                                                "logprobs": 0}).json or {})
        n = len((((c.get("choices") or [{}])[0]).get("logprobs") or {}).get("tokens") or []) - 1
        counts.append(n if line.strip() else 0)
    acc, k1, k2 = 0, None, None
    for i, c in enumerate(counts):
        acc += c
        if k1 is None and acc % 32 == 1 and acc > 32:
            k1, acc1 = i + 1, acc
        elif k1 is not None and (acc - acc1) % 32 == 0 and acc - acc1 >= 64:
            k2 = i + 1
            break
    check("line-aligned chunks of whole segments exist in the text", k1 and k2, f"{counts}")
    if k1 and k2:
        A, B = "\n".join(lines[:k1]) + "\n", "\n".join(lines[k1:k2]) + "\n"
        S.call("POST", "/v1/sessions", {"model": "p", "id": "ps"})
        l1 = (S.call("POST", "/v1/score", {"session": "ps", "text": A, "per_token": True}).json or {}).get("token_logprobs") or []
        l2 = (S.call("POST", "/v1/score", {"session": "ps", "text": B, "per_token": True}).json or {}).get("token_logprobs") or []
        lw = (S.call("POST", "/v1/score", {"model": "p", "text": A + B, "per_token": True}).json or {}).get("token_logprobs") or []
        worst = max((abs(x - y) for x, y in zip(l1 + l2, lw)), default=1)
        check("session: two requests of whole segments score as the whole text", len(l1) + len(l2) == len(lw) > 0
              and worst <= 1e-5, f"{len(l1)} + {len(l2)} vs {len(lw)}: {worst}")
    prompt = "ROMEO: Hello there, my lord!\nJULIET: Good night."
    r = S.call("POST", "/v1/completions", {"model": "p", "prompt": prompt, "max_tokens": 4, "echo": True,
                                            "logprobs": 1, "seed": 5})
    lp = (((r.json or {}).get("choices") or [{}])[0]).get("logprobs") or {}
    ok = r.status == 200
    raw = prompt.encode()
    n_prompt = 0
    for t, o in zip(lp.get("tokens") or [], lp.get("text_offset") or []):
        if o >= len(raw):
            break
        n_prompt += 1
        # the seed's tokenizer lowercases: a piece is its text in the prompt, lowercased; a piece that
        # begins a word begins at the space before it, one that begins a line at its first character
        w = t.strip().encode()
        at = o + 1 if t.startswith(" ") and raw[o:o + 1] == b" " else o
        ok = ok and raw[at:at + len(w)].lower() == w
    check("completions: the seed's pieces at their offsets in the prompt (lowercased by its normalizer)",
          ok and n_prompt >= 10, f"{lp.get('tokens')} {lp.get('text_offset')}")
    r = S.call("POST", "/v1/generate", {"model": "p", "prompt": "ROMEO:", "max_tokens": 20, "temperature": 0})
    j = r.json or {}
    check("greedy generation", r.status == 200 and len(j.get("tokens") or []) == 20 and j.get("text"), f"{r}")


if __name__ == "__main__":
    sys.exit(main())
