#!/usr/bin/env python3
"""
soak.py - `make soak`: clients hammer one server for a while with everything
at once, under the sanitizers (issue 12's soak).

SOAK_CLIENTS clients (default 64) for SOAK_SECONDS (default 60) against one
`spanserve serve` (SPANSERVE_BIN; `make soak` builds and passes the
AddressSanitizer + UBSan one) with the two reference fixtures and a third
model that is unloaded and loaded again all along. Each client loops over a
mix: generations (in its own sessions and without, streamed or not, some cut
off mid-stream by a reset), scoring, OpenAI completions, session creation,
export, import and deletion, requests to the model being unloaded, and
spans reports. At the end:
  - zero sanitizer reports in the server's log, and the server exits 0 on
    SIGTERM;
  - zero 5xx answers;
  - no session lost: every session a client created and did not delete is
    listed, takes a request, and (after the restart that ends the soak)
    is still there with the state it had before the SIGTERM.
Prints the counts by request kind and status, requests/s and latency
percentiles, and `soak.py: N passed, N failed` (a check per condition).
"""
import json
import os
import random
import socket
import struct
import sys
import threading
import time
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_api as T  # noqa: E402
from test_api import A_PATH, TEXT, Server, check  # noqa: E402

CLIENTS = int(os.environ.get("SOAK_CLIENTS", "64"))
SECONDS = float(os.environ.get("SOAK_SECONDS", "60"))

lock = threading.Lock()
counts = Counter()           # (kind, status)
latency = defaultdict(list)  # kind -> seconds
five_xx = []


def note(kind, r, t0):
    with lock:
        counts[(kind, r.status)] += 1
        latency[kind].append(time.time() - t0)
        if r.status >= 500 or r.status == 0:
            five_xx.append(f"{kind}: {r}")


def cut_stream(S, body):
    """A streamed generation whose client resets the connection after a few events: its status."""
    data = json.dumps(dict(body, stream=True)).encode()
    try:
        s = socket.create_connection(("127.0.0.1", S.port), timeout=30)
        s.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(data), data))
        got = b""
        while got.count(b"event: token") < 3:
            d = s.recv(4096)
            if not d:
                break
            got += d
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        return int(got[9:12]) if got[:9] == b"HTTP/1.1 " else 0
    except OSError:
        return 0


def client(S, i, stop, sessions):
    rng = random.Random(i)
    mine = sessions[i]
    model = "aspan" if i % 2 == 0 else "par"
    while time.time() < stop:
        op = rng.random()
        t0 = time.time()
        if op < 0.08 or not mine:
            sid = f"c{i}-{rng.randrange(1 << 30):x}"
            r = S.call("POST", "/v1/sessions", {"model": model, "id": sid}, timeout=60)
            note("session create", r, t0)
            if r.status == 201:
                mine.add(sid)
        elif op < 0.30:
            sid = rng.choice(sorted(mine))
            r = S.call("POST", "/v1/generate", {"session": sid, "prompt": rng.choice(["", "ROMEO:", "\n"]),
                                                "max_tokens": rng.randrange(1, 24), "seed": rng.randrange(1000)},
                       timeout=60)
            note("generate (session)", r, t0)
        elif op < 0.45:
            sid = rng.choice(sorted(mine))
            k = rng.randrange(0, len(TEXT) - 400)
            r = S.call("POST", "/v1/score", {"session": sid, "text": TEXT[k:k + rng.randrange(2, 300)],
                                             "per_token": rng.random() < 0.3}, timeout=60)
            note("score (session)", r, t0)
        elif op < 0.52:
            sid = rng.choice(sorted(mine))
            st = cut_stream(S, {"session": sid, "prompt": "", "max_tokens": 400})
            with lock:
                counts[("generate, cut off by the client", st)] += 1
                if st >= 500 or st == 0:
                    five_xx.append(f"cut off: {st}")
        elif op < 0.62:
            k = rng.randrange(0, len(TEXT) - 600)
            r = S.call("POST", "/v1/score", {"model": model, "text": TEXT[k:k + 500]}, timeout=60)
            note("score", r, t0)
        elif op < 0.70:
            r = S.call("POST", "/v1/completions", {"model": model, "prompt": "To be", "max_tokens": 8,
                                                   "logprobs": 2, "echo": rng.random() < 0.5,
                                                   "stream": rng.random() < 0.3}, timeout=60)
            note("completions", r, t0)
        elif op < 0.78:
            r = S.call("POST", "/v1/generate", {"model": "swap", "prompt": "ab", "max_tokens": 8}, timeout=60)
            note("generate (model unloaded and loaded)", r, t0)
        elif op < 0.84:
            sid = rng.choice(sorted(mine))
            r = S.call("GET", f"/v1/sessions/{sid}/state", timeout=60)
            note("session export", r, t0)
            if r.status == 200:
                t1 = time.time()
                twin = f"{sid}-t{rng.randrange(1 << 20):x}"
                r2 = S.call("PUT", f"/v1/sessions/{twin}/state?model={model}", r.body, ctype="application/octet-stream",
                            timeout=60)
                note("session import", r2, t1)
                if r2.status == 200:
                    mine.add(twin)
        elif op < 0.90 and len(mine) > 2:
            sid = rng.choice(sorted(mine))
            r = S.call("DELETE", f"/v1/sessions/{sid}", timeout=60)
            note("session delete", r, t0)
            if r.status == 200:
                mine.discard(sid)
        elif op < 0.95:
            r = S.call("GET", f"/v1/models/{model}/spans", timeout=60)
            note("spans", r, t0)
        else:
            r = S.call("GET", "/v1/sessions", timeout=60)
            note("session list", r, t0)


def swapper(S, stop):
    while time.time() < stop:
        t0 = time.time()
        r = S.call("DELETE", "/v1/models/swap", timeout=60)
        note("model unload", r, t0)
        if r.status in (200, 404):
            t0 = time.time()
            note("model load", S.call("POST", "/v1/models", {"name": "swap", "path": "swap.safetensors"}, timeout=60), t0)
        time.sleep(0.2)


def main():
    if not os.path.exists(A_PATH) or not TEXT:
        print(f"SKIP soak.py: no reference fixtures at {T.SHARED} or tests/ (set SPANSERVE_SHARED)")
        return 0
    S = Server("soak", extra=["--session-memory", "64M", "--max-queue", "1024", "--max-connections-per-client", "1000"])
    import shutil
    shutil.copy(A_PATH, os.path.join(S.model_dir, "swap.safetensors"))
    T.CURRENT = "soak"
    err = S.start(timeout=120)
    if err:
        check("server", False, err)
        print(f"soak.py: {T.PASS} passed, {T.FAIL} failed")
        return 1
    S.call("POST", "/v1/models", {"name": "swap", "path": "swap.safetensors"})
    sessions = [set() for _ in range(CLIENTS)]
    stop = time.time() + SECONDS
    t_start = time.time()
    ths = [threading.Thread(target=client, args=(S, i, stop, sessions)) for i in range(CLIENTS)]
    ths.append(threading.Thread(target=swapper, args=(S, stop)))
    for t in ths:
        t.start()
    for t in ths:
        t.join(SECONDS + 300)
    elapsed = time.time() - t_start
    # no session lost: listed, usable, and the same after a SIGTERM and a restart
    want = set().union(*sessions)
    listed = {s["id"] for s in (S.call("GET", "/v1/sessions", timeout=120).json or {}).get("sessions", [])}
    check("every session is listed", want <= listed, f"missing {sorted(want - listed)[:5]}")
    before = {}
    for sid in sorted(want):
        r = S.call("GET", f"/v1/sessions/{sid}/state", timeout=120)
        if r.status == 200:
            before[sid] = r.body
    check("every session answers", len(before) == len(want), f"{len(want) - len(before)} did not")
    rc = S.stop(timeout=120)
    check("exit 0 on SIGTERM after the soak", rc == 0, f"{rc}: {S.log_tail(500)}")
    err = S.start(timeout=120)
    check("restarted", err is None, f"{err}")
    same = sum(1 for sid, b in before.items() if S.call("GET", f"/v1/sessions/{sid}/state", timeout=120).body == b)
    check("after the restart every session is there, as it was", same == len(before), f"{same} of {len(before)}")
    check("no 5xx (or transport error)", not five_xx, "; ".join(five_xx[:5]))
    T.finish(S)   # SIGTERM, exit 0, and no sanitizer report in any of its logs
    total = sum(counts.values())
    print(f"soak: {CLIENTS} clients, {elapsed:.0f} s, {total} requests ({total / elapsed:.0f}/s), "
          f"{len(want)} sessions at the end")
    for kind in sorted({k for k, _ in counts}):
        st = ", ".join(f"{s}: {n}" for (k, s), n in sorted(counts.items()) if k == kind)
        lat = sorted(latency.get(kind, []))
        pct = (f"p50 {lat[len(lat) // 2] * 1e3:.0f} ms, p99 {lat[int(len(lat) * 0.99)] * 1e3:.0f} ms" if lat else "")
        print(f"  {kind}: {st}  {pct}")
    print(f"soak.py: {T.PASS} passed, {T.FAIL} failed")
    return 1 if T.FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
