#!/usr/bin/env python3
"""
test_gpt.py - the GPT-style window models (../shared/fixtures/gpt-aspan: the
GPT with adaptive spans of uuzall/adaptive_attention_span; nanogpt-char:
karpathy/nanoGPT) served by the real server over real HTTP: scoring without
a session in windows (each alone: the reference's logprobs; sliding with a
stride; its errors), a session that predicts each token from the window
ending at it (two requests score as one; the greedy tokens of the seeds'
generate; a session exported and imported goes on alike), generation (plain,
seeded, streamed), /v1/completions with echo and logprobs, and the spans
report and picture. Skips, saying so, without ../shared (the fixtures are
not committed). Ends with `test_gpt.py: N passed, N failed`.
"""
import json
import math
import os
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_api as T  # noqa: E402
from test_api import Server, check, sse_events  # noqa: E402
from test_words import read_st, floats, ints  # noqa: E402

FIX = {"gpt-aspan": "g", "nanogpt-char": "n"}


def main():
    paths = {k: os.path.join(T.SHARED, "fixtures", k) for k in FIX}
    if not all(os.path.exists(os.path.join(p, "model.safetensors")) for p in paths.values()):
        print(f"SKIP test_gpt.py: no fixtures gpt-aspan, nanogpt-char under {T.SHARED}/fixtures "
              "(set SPANSERVE_SHARED; CI has them)")
        print("test_gpt.py: 0 passed, 0 failed")
        return 0
    extra = []
    for k, name in FIX.items():
        extra += ["--model", f"{name}={os.path.join(paths[k], 'model.safetensors')}"]
    S = Server("gpt", extra=extra + os.environ.get("SPANSERVE_SERVE_ARGS", "").split())
    T.CURRENT = "gpt"
    err = S.start()
    check("server starts with both GPT models", err is None, f"{err}")
    if err:
        print(f"test_gpt.py: {T.PASS} passed, {T.FAIL} failed")
        return 1
    try:
        for k, name in FIX.items():
            vec, _ = read_st(os.path.join(paths[k], "vectors.safetensors"))
            _, meta = read_st(os.path.join(paths[k], "model.safetensors"))
            run(S, k, name, vec, json.loads(meta["vocab"]))
        errors(S)
    finally:
        T.finish(S)
    print(f"test_gpt.py: {T.PASS} passed, {T.FAIL} failed")
    return 1 if T.FAIL else 0


def run(S, fix, name, vec, vocab):
    T.CURRENT = fix
    info = S.call("GET", f"/v1/models/{name}").json or {}
    prec = info.get("precision", "fp32")
    print(f"{fix}: served on {info.get('device')} ({prec})")
    if "--device cuda" in os.environ.get("SPANSERVE_SERVE_ARGS", ""):
        check(f"{fix} is served on the GPU as asked", info.get("device", "cpu") != "cpu", f"{info.get('device')}")
    tol, mean_tol = (1e-4, 1e-5) if prec == "fp32" else (0.1, 0.01)   # bf16 on a GPU: within 0.1, 0.01 on average
    _, (NW, W) = vec["tokens"][0], vec["tokens"][1]
    toks = ints(vec["tokens"])
    _, (_, _, V) = vec["logprobs"][0], vec["logprobs"][1]
    lp = floats(vec["logprobs"])
    text = "".join(vocab[t] for t in toks)   # the two windows one after the other

    # spans: the window, what a session recomputes, the heads' spans (gpt-aspan)
    r = S.call("GET", f"/v1/models/{name}/spans")
    j = r.json or {}
    spans = fix == "gpt-aspan"
    check(f"{fix} spans: the window and a session's cost", r.status == 200 and j.get("window") == W
          and "recompute" in j and (j.get("session") or {}).get("tokens_held") == W
          and (len(j.get("layers") or []) == 4) == spans, f"{r}")
    if spans:
        heads = [h for y in j["layers"] for h in y["heads"]]
        check("gpt-aspan spans: z of every head (expected.json)",
              sorted(round(h["z"], 4) for h in heads) == sorted([0.05, 0.3, 0.7, 1.0] * 4), f"{heads[:4]}")
    r = S.call("GET", f"/v1/models/{name}/spans?format=svg")
    try:
        ok = ET.fromstring(r.body or b"").tag.endswith("svg")
    except ET.ParseError:
        ok = False
    check(f"{fix} spans: the picture", r.status == 200 and ok, f"{r.status}")

    # scoring without a session: windows of W, each alone. Window 0's inputs are tokens[0..W), and its
    # row i predicts token i+1 (the first row of window 1 predicts with window 0's last row)
    r = S.call("POST", "/v1/score", {"model": name, "text": text, "per_token": True})
    j = r.json or {}
    got = j.get("token_logprobs") or []
    want = [lp[i * V + toks[i + 1]] for i in range(W)]   # window 0 fed whole
    diffs = [abs(x - y) for x, y in zip(got[:W], want)]
    check(f"{fix} score: windows alone give the reference's logprobs ({prec})", r.status == 200
          and len(got) == NW * W - 1 and max(diffs) <= tol and sum(diffs) / W <= mean_tol
          and j.get("windows") == {"window": W, "stride": W}, f"{len(got)} {max(diffs, default=1)} {j.get('windows')}")
    # the second window alone: one character more, so that it is a whole window of W inputs
    r = S.call("POST", "/v1/score", {"model": name, "text": text + vocab[0], "per_token": True})
    g2 = (r.json or {}).get("token_logprobs") or []
    want2 = [lp[(W + i) * V + toks[W + i + 1]] for i in range(W - 1)]
    d2 = max((abs(x - y) for x, y in zip(g2[W:], want2)), default=1)
    check(f"{fix} score: the next window alone", len(g2) == NW * W and d2 <= tol, f"{len(g2)} {d2}")
    # stride W is windows alone; stride 32 slides: each token once, every one after the first window's
    # with 96 tokens before it
    r = S.call("POST", "/v1/score", {"model": name, "text": text, "per_token": True, "stride": W})
    check(f"{fix} score: stride {W} is windows alone", (r.json or {}).get("token_logprobs") == got, f"{r.status}")
    r = S.call("POST", "/v1/score", {"model": name, "text": text, "per_token": True, "stride": 32})
    j = r.json or {}
    gs = j.get("token_logprobs") or []
    check(f"{fix} score: stride 32 scores each token once", r.status == 200 and len(gs) == NW * W - 1
          and j.get("windows") == {"window": W, "stride": 32}, f"{r.status} {len(gs)} {j.get('windows')}")
    if fix == "nanogpt-char":   # causal attention: the first window's rows see what they see alone
        d3 = max((abs(x - y) for x, y in zip(gs[:W], got[:W])), default=1)
        check(f"{fix} score: stride 32 predicts the first window as windows alone", d3 <= 1e-5, f"{d3}")

    # a session: each token predicted from the window ending at it (what the seeds' generate computes)
    r = S.call("POST", "/v1/sessions", {"model": name, "id": f"s{name}"})
    check(f"{fix} a session", r.status in (200, 201), f"{r}")
    whole = S.call("POST", "/v1/score", {"session": f"s{name}", "text": text, "per_token": True})
    lw = (whole.json or {}).get("token_logprobs") or []
    # its prediction at W-1 is window 0's last row, fed whole
    ok = len(lw) == NW * W - 1 and abs(lw[W - 1] - want[W - 1]) <= tol
    check(f"{fix} session: the last row of a full window is the reference's", ok,
          f"{len(lw)} {lw[W - 1] if lw else None} {want[W - 1]}")
    S.call("DELETE", f"/v1/sessions/s{name}")
    S.call("POST", "/v1/sessions", {"model": name, "id": f"t{name}"})
    r1 = S.call("POST", "/v1/score", {"session": f"t{name}", "text": text[:100], "per_token": True})
    r2 = S.call("POST", "/v1/score", {"session": f"t{name}", "text": text[100:], "per_token": True})
    l12 = ((r1.json or {}).get("token_logprobs") or []) + ((r2.json or {}).get("token_logprobs") or [])
    worst = max((abs(x - y) for x, y in zip(l12, lw)), default=1)
    # within the fixtures' bar (tol): the two requests' forwards are products of other shapes than the whole
    # text's, whose float32 sums the BLAS orders differently (a CI machine's AMD EPYC: 1.1e-5)
    check(f"{fix} session: two requests score as the whole text", len(l12) == len(lw) and worst <= tol, f"{worst}")

    # greedy after window 0, each step from the last W tokens (the fixture's `greedy`)
    greedy = ints(vec["greedy"])
    S.call("POST", "/v1/sessions", {"model": name, "id": f"g{name}"})
    S.call("POST", "/v1/score", {"session": f"g{name}", "text": text[:W]})
    r = S.call("POST", "/v1/generate", {"session": f"g{name}", "max_tokens": len(greedy), "temperature": 0})
    gt = (r.json or {}).get("tokens") or []
    same = next((i for i, (a, b) in enumerate(zip(gt, greedy)) if a != b), min(len(gt), len(greedy)))
    check(f"{fix} session: greedy generation is the seed's ({prec})", r.status == 200
          and (same == len(greedy) or (prec != "fp32" and same >= 10)), f"{same} of {len(greedy)} agree")
    # export, import into a new session: both go on alike
    r = S.call("GET", f"/v1/sessions/g{name}/state")
    state = r.body or b""
    check(f"{fix} session: exported", r.status == 200 and len(state) > 0, f"{r.status}")
    r = S.call("PUT", f"/v1/sessions/h{name}/state?model={name}", state, ctype="application/octet-stream")
    check(f"{fix} session: imported", r.status in (200, 204), f"{r}")
    # a state whose window holds a token outside the vocabulary is refused, saying so
    bad = state[:-4] + (9999).to_bytes(4, "little")
    r = S.call("PUT", f"/v1/sessions/b{name}/state?model={name}", bad, ctype="application/octet-stream")
    check(f"{fix} session: a state with a token outside the vocabulary is refused", r.status == 400
          and "token" in ((r.json or {}).get("error") or {}).get("message", ""), f"{r}")
    a = S.call("POST", "/v1/score", {"session": f"g{name}", "text": "O Romeo", "per_token": True})
    b = S.call("POST", "/v1/score", {"session": f"h{name}", "text": "O Romeo", "per_token": True})
    check(f"{fix} session: the imported state predicts as the original",
          (a.json or {}).get("token_logprobs") == (b.json or {}).get("token_logprobs") and a.status == 200,
          f"{a} {b}")

    # generation: seeded, streamed
    body = {"model": name, "prompt": "ROMEO:\n", "max_tokens": 24, "seed": 4, "temperature": 0.8, "top_p": 0.9}
    r = S.call("POST", "/v1/generate", body)
    gtoks = (r.json or {}).get("tokens") or []
    check(f"{fix} generate: 24 tokens of the vocabulary", r.status == 200 and len(gtoks) == 24
          and (r.json or {}).get("text") == "".join(vocab[t] for t in gtoks), f"{r}")
    r2 = S.call("POST", "/v1/generate", body)
    check(f"{fix} generate: a seed repeats", (r2.json or {}).get("tokens") == gtoks, f"{r2}")
    r3 = S.call("POST", "/v1/generate", dict(body, stream=True))
    evs = [json.loads(d) for e, d in sse_events(r3.body or b"") if e == "token"]
    check(f"{fix} generate: streamed, the same tokens", r3.status == 200 and [t["token"] for t in evs] == gtoks,
          f"{r3.status} {len(evs)}")
    # a prompt longer than the window: it slides
    r = S.call("POST", "/v1/generate", {"model": name, "prompt": text[:W + 20], "max_tokens": 8, "temperature": 0})
    check(f"{fix} generate: a prompt past the window", r.status == 200
          and len((r.json or {}).get("tokens") or []) == 8, f"{r}")

    # completions: echo's prompt logprobs are a session's (each token from the window ending before it)
    r = S.call("POST", "/v1/completions", {"model": name, "prompt": text[:40], "max_tokens": 4, "echo": True,
                                            "logprobs": 2, "seed": 1})
    ch = ((r.json or {}).get("choices") or [{}])[0]
    tl = (ch.get("logprobs") or {}).get("token_logprobs") or []
    worst = max((abs(x - y) for x, y in zip(tl[1:40], lw[:39])), default=1)
    check(f"{fix} completions: echo's prompt logprobs are the session's", r.status == 200 and len(tl) == 44
          and tl[0] is None and worst <= 1e-5 and all(isinstance(x, float) and math.isfinite(x) for x in tl[1:]),
          f"{r.status} {len(tl)} {worst}")


def errors(S):
    T.CURRENT = "errors"
    for body, what in (({"model": "g", "text": "abc", "stride": 0}, "stride 0"),
                       ({"model": "g", "text": "abc", "stride": 129}, "stride over the window"),
                       ({"model": "g", "text": "abc", "stride": "8"}, "stride not an integer"),
                       ({"session": "tg", "text": "abc", "stride": 8}, "stride with a session")):
        r = S.call("POST", "/v1/score", body)
        check(f"score: {what} is a 400 that says so", r.status == 400 and "stride" in ((r.json or {}).get("error")
              or {}).get("message", ""), f"{r}")


if __name__ == "__main__":
    sys.exit(main())
