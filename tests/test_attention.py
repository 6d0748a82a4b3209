#!/usr/bin/env python3
"""
test_attention.py - POST /v1/attention through the real server over real
HTTP: what each head of a model attends to.

- aspan-small (tests/fixtures, always present): layer 0's weights against an
  independent computation here, in plain Python from the checkpoint's
  tensors (layer 0's input is the embedding alone: q and k projections, the
  key position embedding, the softmax over the layer's window, the span mask
  and the renormalisation a / (sum a + 1e-8), as ../shared/fixtures/README.md
  specifies the reference): whole rows of every head, top_k lists (their
  keys, weights and order), `before_start` (the zero memory) and every row's
  `sum` against the renormalisation's sum(a m) / (sum(a m) + 1e-8); the
  filters (one layer, one head); the answer against the OpenAPI schema.
- par-small (tests/fixtures): sums 1, weights only on positions <= the query
  within the memory's reach (mem_len rows before the segment); whole rows
  list exactly those positions; a block that is not attention is 400.
- gpt-aspan, nanogpt-char, allattn-small, txl-word from ../shared when
  present (a SKIP line each otherwise): sums, causality, the window or the
  memory's reach, persistent vectors.
- every error: missing or wrong-typed fields, an empty or too long text,
  layer, head, top_k and format out of range, svg without layer and head,
  an unknown model, a character outside the vocabulary.
- format svg: a standalone SVG document (parses as XML) with a title.

Ends with `test_attention.py: N passed, N failed`; exit status 1 on failure.
"""
import json
import math
import os
import socket
import sys
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_api as T  # noqa: E402
from test_api import Server, check, has_error_shape  # noqa: E402
from test_words import read_st, floats  # noqa: E402

try:
    import jsonschema
except ImportError:   # the schema checks say SKIP
    jsonschema = None

SHARED_FIX = {"gpt-aspan": "g", "nanogpt-char": "n", "allattn-small": "aa", "txl-word": "w"}
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n")
DOC = None


def attention(S, body, query=""):
    return S.call("POST", "/v1/attention" + query, body)


_schema_skip_said = False


def conforms(label, r, name):
    """The answer validates against components/schemas/NAME of the server's own OpenAPI document
    (without jsonschema: one SKIP line for all of them)."""
    global _schema_skip_said
    if jsonschema is None:
        if not _schema_skip_said:
            print(f"SKIP test_attention.py schemas: no jsonschema package ({T.INSTALL})")
            _schema_skip_said = True
        return
    schema = {"$ref": f"#/components/schemas/{name}", "components": DOC["components"]}
    try:
        jsonschema.Draft4Validator(schema).validate(r.json)
        check(f"{label}: the answer matches the OpenAPI schema", True)
    except jsonschema.ValidationError as e:
        check(f"{label}: the answer matches the OpenAPI schema", False, f"{e.message} at {list(e.absolute_path)}")


def rows_of(j):
    """{(layer, head): [row, ...]} of an answer."""
    return {(h["layer"], h["head"]): h["rows"] for h in (j or {}).get("heads", [])}


# ---------------------------------------------------------------- aspan-small, independently

def tensor(st, name):
    dt, shape, _ = st[name]
    assert dt == "F32", f"{name} is {dt}"
    return floats(st[name]), shape


def aspan_layer0(path, toks):
    """Layer 0's final attention weights of TOKS fed as one stream from a zero
    memory, computed here from the checkpoint: {head: [(weights {position: w},
    before_start, sum) per query]}."""
    st, meta = read_st(path)
    cfg = json.loads(meta["config"])
    H, K, S, R = cfg["hidden_size"], cfg["nb_heads"], cfg["attn_span"], cfg["adapt_span_ramp"]
    D = H // K
    emb, _ = tensor(st, "in_emb.weight")
    wq, _ = tensor(st, "layers.0.attn.proj_query.weight")
    wk, _ = tensor(st, "layers.0.attn.proj_key.weight")
    pe, _ = tensor(st, "key_pe")   # 1 x D x S: pe[c][j], column j is distance S - j
    z = tensor(st, "layers.0.attn.attn.adaptive_span._mask.current_val")[0]
    # the window the reference attends over: S - trim_len, from the spans (fixtures README)
    cms = min(S, math.ceil(max(z) * S) + R)
    window = S - (min(S - 1, S - cms) // 64) * 64
    n = len(toks)
    x = [emb[t * H:(t + 1) * H] for t in toks]

    def proj(w, v):
        return [sum(a * b for a, b in zip(w[i * H:(i + 1) * H], v)) for i in range(H)]

    q = [proj(wq, v) for v in x]
    k = [proj(wk, v) for v in x]
    pe_col = {d: [pe[c * S + (S - d)] for c in range(D)] for d in range(1, window + 1)}
    out = {}
    for h in range(K):
        zS = z[h] * S
        mask = {d: min(1.0, max(0.0, (1 - d + zS) / R + 1)) for d in range(1, window + 1)}
        rows = []
        for t in range(n):
            qh = q[t][h * D:(h + 1) * D]
            sc = {}
            for d in range(1, window + 1):
                s = sum(a * b for a, b in zip(qh, pe_col[d]))
                if t - d >= 0:   # before the start the keys are the zero memory's: 0
                    s += sum(a * b for a, b in zip(qh, k[t - d][h * D:(h + 1) * D]))
                sc[d] = s / math.sqrt(D)
            mx = max(sc.values())
            e = {d: math.exp(s - mx) for d, s in sc.items()}
            Z = sum(e.values())
            a = {d: e[d] / Z * mask[d] for d in e}
            zm = sum(a.values())
            w = {t - d: v / (zm + 1e-8) for d, v in a.items() if v > 0}
            before = sum(v for p, v in w.items() if p < 0)
            rows.append(({p: v for p, v in w.items() if p >= 0}, before, zm / (zm + 1e-8)))
        out[h] = rows
    return out, K


def aspan_small(S, path, vocab):
    T.CURRENT = "aspan-small"
    ids = {c: i for i, c in enumerate(vocab)}
    text = TEXT[:90]   # 90 tokens: two blocks of 64
    toks = [ids[c] for c in text]
    want, K = aspan_layer0(path, toks)
    tol = 2e-5

    # whole rows: layer 0, each head
    for h in range(K):
        r = attention(S, {"model": "aspan", "text": text, "layer": 0, "head": h})
        j = r.json or {}
        rows = rows_of(j).get((0, h)) or []
        ok = r.status == 200 and j.get("full") is True and len(rows) == len(toks) and list(rows_of(j)) == [(0, h)]
        check(f"layer 0 head {h}: whole rows, one per position", ok, f"{r.status} {len(rows)}")
        if not ok:
            continue
        if h == 0:
            conforms("whole rows", r, "AttentionResponse")
            check("tokens: ids, texts and offsets of the text", [t["id"] for t in j["tokens"]] == toks
                  and "".join(t["text"] for t in j["tokens"]) == text
                  and [t["offset"] for t in j["tokens"]] == list(range(len(text))), f"{j['tokens'][:3]}")
        worst_w = worst_b = worst_s = worst_self = 0.0
        bad_keys = []
        for t, row in enumerate(rows):
            ww, wb, ws = want[h][t]
            got = dict(zip(row["keys"], row["weights"]))
            if row["query"] != t or row["keys"] != sorted(row["keys"]) or any(p >= t for p in row["keys"]):
                bad_keys.append(t)
            for p in set(got) | set(ww):
                worst_w = max(worst_w, abs(got.get(p, 0.0) - ww.get(p, 0.0)))
            worst_b = max(worst_b, abs(row["before_start"] - wb))
            worst_s = max(worst_s, abs(row["sum"] - ws))
            worst_self = max(worst_self, abs(sum(row["weights"]) + row["before_start"] - row["sum"]))
        check(f"layer 0 head {h}: keys strictly before the query, in order", not bad_keys, f"queries {bad_keys[:5]}")
        check(f"layer 0 head {h}: weights are the independent computation's", worst_w <= tol, f"{worst_w}")
        check(f"layer 0 head {h}: before_start is the zero memory's weight", worst_b <= tol, f"{worst_b}")
        check(f"layer 0 head {h}: every sum is sum(a m) / (sum(a m) + 1e-8)", worst_s <= 3e-7, f"{worst_s}")
        check(f"layer 0 head {h}: the sum is the row's weights", worst_self <= 1e-5, f"{worst_self}")

    # top_k: every head of layer 0, the heaviest 5 keys of each row
    r = attention(S, {"model": "aspan", "text": text, "layer": 0, "top_k": 5})
    j = r.json or {}
    got = rows_of(j)
    check("layer 0, top_k 5: every head, in order", r.status == 200 and j.get("full") is False and j.get("top_k") == 5
          and list(got) == [(0, h) for h in range(K)], f"{r.status} {list(got)}")
    conforms("top_k rows", r, "AttentionResponse")
    worst, order, count, sums = 0.0, [], [], 0.0
    for h in range(K):
        for t, row in enumerate(got.get((0, h), [])):
            ww, wb, ws = want[h][t]
            w = row["weights"]
            if any(w[i] < w[i + 1] for i in range(len(w) - 1)):
                order.append((h, t))
            if len(w) != min(5, len(ww)):
                count.append((h, t, len(w), len(ww)))
            ranked = sorted(ww.values(), reverse=True)
            for i, (p, v) in enumerate(zip(row["keys"], w)):
                worst = max(worst, abs(v - ww.get(p, 0.0)), abs(v - ranked[i]))
            sums = max(sums, abs(row["sum"] - ws))
    check("top_k: heaviest first", not order, f"{order[:5]}")
    check("top_k: min(top_k, keys in reach) keys a row", not count, f"{count[:5]}")
    check("top_k: the heaviest keys of the independent computation", worst <= tol, f"{worst}")
    check("top_k: the same sums as whole rows", sums <= 3e-7, f"{sums}")

    # the renormalisation's 1e-8, where it shows: a text whose layer-0 head 0 puts little mass
    # (sum(a m) ~ 0.006) within its span leaves rows summing to 1 - 1.7e-6, not 1
    text2 = ";" * 40
    want2, _ = aspan_layer0(path, [ids[c] for c in text2])
    r = attention(S, {"model": "aspan", "text": text2, "layer": 0, "head": 0})
    rows = rows_of(r.json).get((0, 0)) or []
    short = [(t, row["sum"], want2[0][t][2]) for t, row in enumerate(rows) if 1 - want2[0][t][2] > 1e-6]
    check("the renormalisation's 1e-8: rows whose sum(a m) is small sum to less than 1, as the reference's",
          r.status == 200 and short and all(abs(s - w) <= 3e-7 for _, s, w in short), f"{r.status} {short[:3]}")

    # the default: every layer, every head, top_k 8
    r = attention(S, {"model": "aspan", "text": text[:20]})
    j = r.json or {}
    check("default: 4 layers x 4 heads, top_k 8", r.status == 200 and j.get("top_k") == 8
          and list(rows_of(j)) == [(l, h) for l in range(4) for h in range(4)]
          and all(len(row["keys"]) <= 8 and 0 <= row["sum"] <= 1 + 1e-6 for rows in rows_of(j).values() for row in rows),
          f"{r.status} {list(rows_of(j))[:5]}")
    r = attention(S, {"model": "aspan", "text": text[:20], "head": 2})
    check("head 2: every layer's head 2", r.status == 200 and list(rows_of(r.json)) == [(l, 2) for l in range(4)],
          f"{r.status} {list(rows_of(r.json))}")
    r = attention(S, {"model": "aspan", "text": text[:20], "layer": 3, "top_k": 64, "format": "json"})
    check("layer 3, top_k 64: its 4 heads", r.status == 200 and list(rows_of(r.json)) == [(3, h) for h in range(4)],
          f"{r.status}")
    # the same text read again: the same bits (the forward's own weights)
    r1 = attention(S, {"model": "aspan", "text": text, "layer": 0, "head": 3})
    r2 = attention(S, {"model": "aspan", "text": text, "layer": 0, "head": 3})
    check("the same request twice: the same answer", r1.status == 200 and r1.body == r2.body, f"{r1.status}")


# ---------------------------------------------------------------- memory families: reach and sums

def memory_rows(label, j, lo_of, strict, sum_tol=1e-5, exact_sum=True):
    """Every row of J: keys within [lo_of(t), t] (before t when STRICT),
    weights >= 0, heaviest first, sum 1 (EXACT_SUM) or in [0, 1]."""
    bad_reach, bad_sum, bad_order = [], [], []
    for (l, h), rows in rows_of(j).items():
        for t, row in enumerate(rows):
            hi = t - 1 if strict else t
            if row["query"] != t or any(p < lo_of(t) or p > hi for p in row["keys"]) or min(row["weights"] or [0]) < 0:
                bad_reach.append((l, h, t, row["keys"][:4]))
            s = row["sum"]
            if (abs(s - 1) > sum_tol) if exact_sum else not (-1e-9 <= s <= 1 + sum_tol):
                bad_sum.append((l, h, t, s))
            w = row["weights"]
            if not j.get("full") and any(w[i] < w[i + 1] for i in range(len(w) - 1)):
                bad_order.append((l, h, t))
    check(f"{label}: weights only on positions the query saw", not bad_reach, f"{bad_reach[:3]}")
    check(f"{label}: sums are {'1' if exact_sum else 'in [0, 1]'}", not bad_sum, f"{bad_sum[:3]}")
    check(f"{label}: top_k heaviest first", not bad_order, f"{bad_order[:3]}")


def par_small(S):
    T.CURRENT = "par-small"
    r = S.call("GET", "/v1/models/par")
    cfg = (r.json or {}).get("config") or {}
    ML, L, arch = cfg.get("mem_len", 96), cfg.get("tgt_len", 48), cfg.get("arch", [])
    attn = [b for b, k in enumerate(arch) if k == "attn"]
    text = TEXT[:150]   # 4 segments of 48: the memory's reach matters from the third

    def lo(t):
        return max(0, (t // L) * L - ML)

    r = attention(S, {"model": "par", "text": text})
    j = r.json or {}
    check("every attention block and head, top_k 8", r.status == 200 and j.get("family") == "par-transformer-xl"
          and list(rows_of(j)) == [(b, h) for b in attn for h in range(4)], f"{r.status} {list(rows_of(j))}")
    conforms("par top_k", r, "AttentionResponse")
    memory_rows("par top_k", j, lo, strict=False)
    check("par: nothing before the start", all(row["before_start"] == 0 for rows in rows_of(j).values() for row in rows))
    b = attn[1]
    r = attention(S, {"model": "par", "text": text, "layer": b, "head": 1})
    j = r.json or {}
    rows = rows_of(j).get((b, 1)) or []
    check(f"block {b} head 1: whole rows", r.status == 200 and len(rows) == len(text), f"{r.status} {len(rows)}")
    memory_rows("par whole rows", j, lo, strict=False)
    wrong = [t for t, row in enumerate(rows) if row["keys"] != list(range(lo(t), t + 1))]
    check("par whole rows: the memory's rows and the segment up to the query, exactly", not wrong,
          f"queries {wrong[:5]}: {rows[wrong[0]]['keys'][:3] if wrong else ''}")
    worst = max((abs(sum(row["weights"]) - row["sum"]) for row in rows), default=1)
    check("par whole rows: the weights add up to the sum", worst <= 1e-5, f"{worst}")
    non = next((b for b, k in enumerate(arch) if k != "attn"), None)
    r = attention(S, {"model": "par", "text": text, "layer": non})
    check(f"block {non} ({arch[non] if non is not None else '?'}): 400 naming the attention blocks",
          r.status == 400 and has_error_shape(r, 400)
          and ", ".join(map(str, attn)) in ((r.json or {}).get("error") or {}).get("message", ""), f"{r}")


# ---------------------------------------------------------------- the larger fixtures

def shared_fixture(S, fix, name):
    T.CURRENT = fix
    m = S.call("GET", f"/v1/models/{name}").json or {}
    cfg = m.get("config") or {}
    if fix == "txl-word":
        vocab = json.loads(read_st(os.path.join(T.SHARED, "fixtures", fix, "model.safetensors"))[1]["vocab"])
        words = [w for w in vocab[2:400] if w.isalpha()][:60]
        text = " ".join(words * 3)[:2000] + "\n"   # 180 words and <eos>: four segments
    else:
        text = TEXT
    r = attention(S, {"model": name, "text": text, "top_k": 6})
    j = r.json or {}
    n = len(j.get("tokens") or [])
    check("every layer and head, top_k 6", r.status == 200 and n > 100 and len(rows_of(j)) > 0
          and all(len(rows) == n for rows in rows_of(j).values()), f"{r.status} {n} {r.body[:200]}")
    conforms(fix, r, "AttentionResponse")
    if fix in ("gpt-aspan", "nanogpt-char"):
        C = cfg.get("block_size", 128)
        lo = (lambda t: max(0, t - C + 1))
        memory_rows(f"{fix}: the window ending at the query", j, lo, strict=False, exact_sum=fix == "nanogpt-char")
        first = next(iter(rows_of(j)))
        r = attention(S, {"model": name, "text": text, "layer": first[0], "head": 2})
        rows = rows_of(r.json).get((first[0], 2)) or []
        wrong = [t for t, row in enumerate(rows) if row["keys"] != list(range(lo(t), t + 1))]
        check(f"{fix} whole rows: the window's positions exactly", r.status == 200 and len(rows) == n and not wrong,
              f"{r.status} {wrong[:5]}")
        worst = max((abs(sum(row["weights"]) - row["sum"]) for row in rows), default=1)
        check(f"{fix} whole rows: the weights add up to the sum", worst <= 1e-5, f"{worst}")
    elif fix == "allattn-small":
        P = j.get("pers_mem_size")
        memory_rows("allattn: keys before the query", j, lambda t: 0, strict=True, exact_sum=False)
        check("allattn: the persistent vectors' weight on every row", P == 24
              and all("persistent" in row and row["persistent"] >= 0 for rows in rows_of(j).values() for row in rows),
              f"{P}")
        r = attention(S, {"model": name, "text": text, "layer": 1, "head": 0})
        rows = rows_of(r.json).get((1, 0)) or []
        worst = max((abs(sum(row["weights"]) + row["before_start"] + row["persistent"] - row["sum"])
                     + abs(sum(row.get("persistent_weights") or [9]) - row["persistent"]) for row in rows), default=1)
        check("allattn whole rows: each persistent vector's weight; the row adds up to the sum",
              r.status == 200 and len(rows) == n and all(len(row.get("persistent_weights", [])) == P for row in rows)
              and worst <= 1e-5, f"{r.status} {worst}")
    else:   # txl-word: eval_mem_len rows of memory, eval_tgt_len segments (same_length: as many keys a query)
        ML, L = cfg.get("eval_mem_len", 96), cfg.get("eval_tgt_len", 48)
        lo = (lambda t: max(0, (t // L) * L - ML))
        memory_rows("txl-word: the memory and the segment", j, lo, strict=False)
        check("txl-word: layers are blocks, attention the even ones",
              sorted({l for l, _ in rows_of(j)}) == [0, 2, 4, 6], f"{sorted({l for l, _ in rows_of(j)})}")
        r = attention(S, {"model": name, "text": text, "layer": 1})
        check("txl-word: block 1 (a feed-forward) is 400", r.status == 400 and has_error_shape(r, 400), f"{r}")
        r = attention(S, {"model": name, "text": text, "layer": 2, "head": 3})
        rows = rows_of(r.json).get((2, 3)) or []
        reach = [t for t, row in enumerate(rows) if t >= ML and len(row["keys"]) != ML]
        check("txl-word whole rows (same_length): every query past the memory sees eval_mem_len keys",
              r.status == 200 and len(rows) == n and not reach, f"{r.status} {reach[:5]}")


# ---------------------------------------------------------------- errors and the picture

def errors(S, vocab):
    T.CURRENT = "errors"
    ok_text = TEXT[:30]
    cases = [
        ("no text", {"model": "aspan"}, 400),
        ("text not a string", {"model": "aspan", "text": 12}, 400),
        ("empty text", {"model": "aspan", "text": ""}, 400),
        ("no model", {"text": ok_text}, 400),
        ("model not a string", {"model": 3, "text": ok_text}, 400),
        ("unknown model", {"model": "nope", "text": ok_text}, 404),
        ("layer past the model's", {"model": "aspan", "text": ok_text, "layer": 4}, 400),
        ("negative layer", {"model": "aspan", "text": ok_text, "layer": -1}, 400),
        ("layer not an integer", {"model": "aspan", "text": ok_text, "layer": "0"}, 400),
        ("fractional layer", {"model": "aspan", "text": ok_text, "layer": 0.5}, 400),
        ("head past the model's", {"model": "aspan", "text": ok_text, "head": 4}, 400),
        ("negative head", {"model": "aspan", "text": ok_text, "head": -2}, 400),
        ("top_k 0", {"model": "aspan", "text": ok_text, "top_k": 0}, 400),
        ("top_k 65", {"model": "aspan", "text": ok_text, "top_k": 65}, 400),
        ("top_k a string", {"model": "aspan", "text": ok_text, "top_k": "8"}, 400),
        ("format png", {"model": "aspan", "text": ok_text, "format": "png"}, 400),
        ("format not a string", {"model": "aspan", "text": ok_text, "format": 1}, 400),
        ("svg without layer or head", {"model": "aspan", "text": ok_text, "format": "svg"}, 400),
        ("svg without head", {"model": "aspan", "text": ok_text, "format": "svg", "layer": 0}, 400),
        ("too long: 1025 tokens", {"model": "aspan", "text": (TEXT * 20)[:1025]}, 413),
        ("svg too long: 257 tokens", {"model": "aspan", "text": (TEXT * 20)[:257], "layer": 0, "head": 0,
                                       "format": "svg"}, 413),
        ("a character outside the vocabulary", {"model": "aspan", "text": "caf\u00e9"}, 422),
    ]
    for label, body, status in cases:
        r = attention(S, body)
        check(f"{label}: {status}", r.status == status and has_error_shape(r, status), f"{r}")
    r = attention(S, {"model": "aspan", "text": ok_text, "layer": 0, "head": 0, "format": "json"}, "?format=svg")
    check("format twice, differently: 400", r.status == 400 and has_error_shape(r, 400), f"{r}")
    r = S.call("POST", "/v1/attention", "{not json")
    check("a body that is not JSON: 400", r.status == 400 and has_error_shape(r, 400), f"{r}")
    r = S.call("POST", "/v1/attention", {"model": "aspan", "text": ok_text}, ctype="text/plain")
    check("not application/json: 415", r.status == 415 and has_error_shape(r, 415), f"{r}")
    r = S.call("GET", "/v1/attention")
    check("GET: 405", r.status == 405 and has_error_shape(r, 405), f"{r}")
    r = attention(S, {"model": "aspan", "text": (TEXT * 20)[:1024], "layer": 0, "head": 0})
    check("1024 tokens (the bound): 200", r.status == 200 and len(rows_of(r.json).get((0, 0)) or []) == 1024,
          f"{r.status}")
    check("the server still answers", S.healthy())


def svg(S, present):
    T.CURRENT = "svg"
    for q, body in (("", {"format": "svg"}), ("?format=svg", {})):
        r = attention(S, dict({"model": "aspan", "text": "To be, or not to be", "layer": 0, "head": 1}, **body), q)
        try:
            root = ET.fromstring(r.body or b"")
        except ET.ParseError as e:
            root = None
            check(f"svg{q}: parses as XML", False, f"{e}: {r.body[:200]!r}")
        ns = "{http://www.w3.org/2000/svg}"
        title = root.find(f"{ns}title") if root is not None else None
        cells = root.findall(f"{ns}rect") if root is not None else []
        check(f"svg{q}: a standalone SVG with a title and the heat map's cells", r.status == 200
              and r.headers.get("content-type") == "image/svg+xml" and root is not None and root.tag == f"{ns}svg"
              and title is not None and "layer 0 head 1" in (title.text or "") and len(cells) > 19,
              f"{r.status} {r.headers.get('content-type')} {title.text if title is not None else None} {len(cells)}")
    # markup and whitespace in the tokens come out escaped (txl-word: "<unk>", "<eos>")
    cases = [("par", "a & b'\n\n c", 3)] + ([("w", "the zzqqxx &lt; of\n", 0)] if "w" in present else [])
    for name, text, layer in cases:
        r = attention(S, {"model": name, "text": text, "layer": layer, "head": 0, "format": "svg"})
        try:
            ET.fromstring(r.body or b"")
            ok = True
        except ET.ParseError:
            ok = False
        check(f"svg {name}: markup and whitespace in the tokens are escaped", r.status == 200 and ok,
              f"{r.status} {r.body[:300]!r}")


def abandoned(S):
    """Clients that leave while their attention is computed: the work's answer is freed with the
    connection (the sanitizers' build reports a leak otherwise, at the end), and the server goes on."""
    T.CURRENT = "abandoned"
    text = "First Citizen:\nBefore we proceed any further, hear me speak." * 4
    for fmt in ("", "?format=svg"):
        for i in range(12):
            body = json.dumps({"model": "aspan", "text": text, "layer": 0, "head": 1}).encode()
            s = socket.create_connection(("127.0.0.1", S.port))
            s.sendall(f"POST /v1/attention{fmt} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            time.sleep(0.001 * i)
            s.close()
    time.sleep(1)
    r = attention(S, {"model": "aspan", "text": "To be, or not to be"})
    check("after clients left mid-computation, the next request is answered", r.status == 200, f"{r}")


def main():
    global DOC
    extra, present = [], {}
    for fix, name in SHARED_FIX.items():
        p = os.path.join(T.SHARED, "fixtures", fix, "model.safetensors")
        if os.path.exists(p):
            extra += ["--model", f"{name}={p}"]
            present[fix] = name
        else:
            print(f"SKIP test_attention.py {fix}: no fixture at {os.path.dirname(p)} (set SPANSERVE_SHARED; CI has it)")
    S = Server("attention", extra=extra + os.environ.get("SPANSERVE_SERVE_ARGS", "").split())
    T.CURRENT = "attention"
    err = S.start()
    check("server starts", err is None, f"{err}")
    if err:
        print(f"test_attention.py: {T.PASS} passed, {T.FAIL} failed")
        return 1
    try:
        DOC = S.call("GET", "/openapi.json").json or {}
        # a model served on a GPU is read through the CPU forward all the same (its host weights)
        info = S.call("GET", "/v1/models/aspan").json or {}
        print(f"aspan: served on {info.get('device')} ({info.get('precision')})")
        if "--device cuda" in os.environ.get("SPANSERVE_SERVE_ARGS", ""):
            check("aspan is served on the GPU as asked", info.get("device", "cpu") != "cpu", f"{info.get('device')}")
        check("openapi.json documents POST /v1/attention", "post" in (DOC.get("paths") or {}).get("/v1/attention", {}))
        _, meta = read_st(T.A_PATH)
        vocab = json.loads(meta["vocab"])
        aspan_small(S, T.A_PATH, vocab)
        par_small(S)
        for fix, name in present.items():
            shared_fixture(S, fix, name)
        errors(S, vocab)
        svg(S, set(present.values()))
        abandoned(S)
    finally:
        T.finish(S)
    print(f"test_attention.py: {T.PASS} passed, {T.FAIL} failed")
    return 1 if T.FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
