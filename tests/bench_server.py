#!/usr/bin/env python3
"""bench_server.py - scoring through the HTTP server (issue 18's `make bench`
line): the real server (SPANSERVE_BIN, default bin/spanserve) serving one
model at a time, then 1 request alone, 16 and 64 concurrent POST /v1/score
requests, each of a different text of 100,000 characters (slices of
SHARED/data/tiny_shakespeare.txt, else tests/data's copy, starting at
different offsets, wrapping around). For each: wall time from the first
request sent to the last answer read, tokens scored (the answers' sums),
tokens/s, p50 and p99 request latency. Every answer must be 200 with the
tokens a text of n characters has to predict (n - 1, a character model
without a session), and text 0's bpc must agree across the rounds to 0.05
(a batched step that went wrong, not rounding); anything else prints FAIL
and exits 1. Ends with a markdown table, a row per model, memory mode and
precision.

    tests/bench_server.py [options] [NAME=]MODEL.safetensors ...

    --memory exact,span   adaptive-span memory modes to run (a server each;
                          other families run once); default exact
    --concurrency 16,64   the concurrent rounds (1 alone always runs first)
    --chars N             characters a text (default 100000)
    --quick               --chars 2000 --concurrency 4,16: a CPU check
env SPANSERVE_SERVE_ARGS  more `spanserve serve` flags, split on spaces
                          (on the GPU: "--device cuda --precision bf16")
env SPANSERVE_SHARED      the shared folder (default ../shared)

Limits (README "`spanserve serve` flags"), for 64 x 100,000 characters:
--max-body (8M a body), --max-prompt (1,000,000 tokens), --max-queue (256),
--max-connections and --max-connections-per-client (1000, 256) and
--header-timeout (10 s; each connection sends at once) are not in the way.
--max-step-gflop (200) is: the scheduler cuts each forward to 200 GFLOP /
the model's cost of a block of one stream (GET /v1/models/NAME "cost":
aspan-enwik8's block of 512 is 59.6 GFLOP in exact memory and 44.7 in span
memory, par-base's 53.8), so 16 or 64 streams would go through 3 or 4 at a
time. The bench passes --max-step-gflop 1000000, so that the scheduler
alone (up to 256 streams a forward) batches them, and prints what the
default would have allowed. --request-timeout (600 s) fails a round slower
than 10 minutes (64 x 100,000 tokens below 10,700 tokens/s): the bench
passes 3600, a guard for slow runs (fp32, the CUDA-core kernels).
--state-dir is a temporary folder, removed after (no session is made).
"""
import argparse, json, math, os, shutil, signal, socket, subprocess, sys, tempfile, threading, time, http.client

BIN = os.environ.get("SPANSERVE_BIN", "bin/spanserve")
SHARED = os.environ.get("SPANSERVE_SHARED", "../shared")
# the flags that lift what stops 64 x 100 kB (the docstring)
BENCH_FLAGS = ["--max-step-gflop", "1000000", "--request-timeout", "3600"]
DEFAULT_STEP_GFLOP = 200   # serve.c's default, for the line saying what it would have allowed
failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL {msg}", flush=True)


def ref_path(rel):
    """SHARED/REL when it is there, else the copy in tests/ (tests/harness.h's rule)."""
    p = os.path.join(SHARED, rel)
    return p if os.path.exists(p) else os.path.join("tests", rel)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    """`spanserve serve` with one model NAME=PATH on a free port; waits for /readyz."""

    def __init__(self, name, path, extra):
        self.port = free_port()
        self.state = tempfile.mkdtemp(prefix="spanserve-bench-state-")
        self.log = tempfile.TemporaryFile()
        self.args = [BIN, "serve", "--listen", f"127.0.0.1:{self.port}", "--state-dir", self.state,
                     "--model", f"{name}={path}", *extra]
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=self.log)
        deadline = time.time() + 300   # a 190 MB checkpoint read, checked and uploaded
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if self.call("GET", "/readyz", timeout=5)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not become ready: {' '.join(self.args)}\n{self.output()[-3000:]}")

    def output(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def call(self, method, path, body=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                      headers={"Content-Type": "application/json"} if body is not None else {})
            r = c.getresponse()
            data = r.read()
        finally:
            c.close()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.state, ignore_errors=True)


def percentile(xs, p):
    """Nearest rank: the smallest x with at least p% of XS at or below it."""
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def score_round(srv, model, texts, per_char):
    """len(texts) concurrent /v1/score requests, each on a connection opened
    beforehand, released together. Returns (wall s, tokens, latencies,
    answers) and records a failure for any answer not 200 or of the wrong
    token count."""
    n = len(texts)
    gate = threading.Barrier(n + 1)
    out = [None] * n

    def one(i):
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=7200)
        body = json.dumps({"model": model, "text": texts[i]}).encode()
        try:
            c.connect()
            gate.wait()
            t0 = time.perf_counter()
            c.request("POST", "/v1/score", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            out[i] = (r.status, data, time.perf_counter() - t0, time.perf_counter())
        except Exception as e:   # a refused or dropped connection is a result to report, not a crash
            out[i] = (0, repr(e).encode(), 0.0, time.perf_counter())
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    gate.wait()
    t_start = time.perf_counter()
    for t in threads:
        t.join()
    wall = max(o[3] for o in out) - t_start
    tokens, lat, answers = 0, [], []
    for i, (status, data, dt, _) in enumerate(out):
        try:
            j = json.loads(data)
        except ValueError:
            j = None
        if status != 200 or not isinstance(j, dict):
            fail(f"{model}: request {i} of {n}: status {status}: {data[:300]!r}")
            answers.append(None)
            continue
        want = len(texts[i]) - 1
        if per_char and j.get("tokens") != want:
            fail(f"{model}: request {i} of {n}: {j.get('tokens')} tokens scored, want {want}")
        if not isinstance(j.get("nll"), (int, float)) or not math.isfinite(j["nll"]):
            fail(f"{model}: request {i} of {n}: nll {j.get('nll')!r}")
        tokens += j.get("tokens", 0)
        lat.append(dt)
        answers.append(j)
    return wall, tokens, lat, answers


def bench_one(path, mode, args, texts, extra):
    """One server, one model (in one memory mode): the rounds. Returns the
    table row (None when the server did not start) and the model's family."""
    name, _, path = path.rpartition("=") if "=" in path else (os.path.basename(path).rsplit(".", 1)[0], "", path)
    flags = extra + BENCH_FLAGS + (["--memory", mode] if mode else [])
    try:
        srv = Server(name, path, flags)
    except RuntimeError as e:
        fail(f"{name}: {e}")
        return None, None
    try:
        st, info = srv.call("GET", f"/v1/models/{name}")
        if st != 200:
            fail(f"{name}: GET /v1/models/{name}: {st} {info!r}")
            return None, None
        family, device, prec = info.get("family"), info.get("device"), info.get("precision")
        memory = (info.get("memory") or {}).get("mode", "-") if family == "adaptive-span" else "-"
        per_char = info.get("tokenizer") == "chars"
        block = (info.get("cost") or {}).get("flops_per_block", 0)
        cap = max(1, min(256, int(DEFAULT_STEP_GFLOP * 1e9 / block))) if block else 256
        print(f"\n{name}: {family}, memory {memory}, {device}, {prec}; {block / 1e9:.1f} GFLOP a block of one "
              f"stream: the default --max-step-gflop {DEFAULT_STEP_GFLOP} would cut a forward to {cap} stream(s); "
              f"serve flags: {' '.join(flags)}", flush=True)
        # warm-up: the first forwards of each shape (cuBLAS, graphs), not timed
        score_round(srv, name, [t[:3000] for t in texts[:4]], per_char)
        rounds, bpc0 = {}, {}
        for n in [1] + args.concurrency:
            wall, tokens, lat, answers = score_round(srv, name, texts[:n], per_char)
            rounds[n] = (wall, tokens, lat)
            if answers and answers[0]:
                bpc0[n] = answers[0].get("bpc", answers[0]["nll"] / math.log(2))
            print(f"  {n:3d} {'concurrent' if n > 1 else 'alone':10s}: {tokens:,} tokens in {wall:.2f} s: {tokens / wall if wall > 0 else 0:,.0f} "
                  f"tokens/s; latency p50 {percentile(lat, 50) if lat else 0:.2f} s, p99 "
                  f"{percentile(lat, 99) if lat else 0:.2f} s, max {max(lat) if lat else 0:.2f} s", flush=True)
        if bpc0:
            spread = max(bpc0.values()) - min(bpc0.values())
            print(f"  text 0's bpc: " + ", ".join(f"{v:.6f} ({k})" for k, v in bpc0.items()) + f"; spread {spread:.2e}")
            if spread > 0.05:
                fail(f"{name}: text 0's bpc moves by {spread:.3f} between the rounds")
    finally:
        srv.stop()

    def cell(n):
        wall, tokens, lat = rounds[n]
        if not lat:
            return "- | - | -" if n > 1 else "- | -"
        return (f"{tokens / wall:,.0f} | {percentile(lat, 50) * 1e3:,.0f} ms | {percentile(lat, 99) * 1e3:,.0f} ms"
                if n > 1 else f"{tokens / wall:,.0f} | {lat[0] * 1e3:,.0f} ms")
    return f"| {name} | {memory} | {prec} | {device} | " + " | ".join(cell(n) for n in [1] + args.concurrency) + " |", family


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="checkpoints (.safetensors), each served alone as its file's name, "
                    "or NAME=PATH")
    ap.add_argument("--memory", default="exact", help="adaptive-span memory modes, comma-separated")
    ap.add_argument("--concurrency", help="concurrent rounds, comma-separated (default 16,64)")
    ap.add_argument("--chars", type=int, help="characters a text (default 100000)")
    ap.add_argument("--quick", action="store_true", help="--chars 2000 --concurrency 4,16 (unless given)")
    args = ap.parse_args()
    args.chars = args.chars or (2000 if args.quick else 100000)
    args.concurrency = args.concurrency or ("4,16" if args.quick else "16,64")
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x]
    extra = os.environ.get("SPANSERVE_SERVE_ARGS", "").split()
    if not os.access(BIN, os.X_OK):
        print(f"FAIL bench_server.py: no server binary {BIN} (set SPANSERVE_BIN)")
        return 1
    src = ref_path("data/tiny_shakespeare.txt")
    with open(src, encoding="utf-8") as f:
        corpus = f.read()
    n = max([1] + args.concurrency)
    if args.chars < 2 or args.chars > len(corpus):
        print(f"FAIL bench_server.py: --chars {args.chars} is outside [2, {len(corpus)}] ({src})")
        return 1
    ring = corpus + corpus[:args.chars]
    step = len(corpus) // n
    texts = [ring[i * step:i * step + args.chars] for i in range(n)]   # n different texts
    print(f"bench_server.py: {BIN} {' '.join(extra)}; texts of {args.chars:,} characters from {src}")
    rows = []
    for path in args.models:
        for mode in [m for m in args.memory.split(",") if m] or ["exact"]:
            row, family = bench_one(path, mode, args, texts, extra)
            if row:
                rows.append(row)
            if family != "adaptive-span":   # the memory modes are adaptive-span's: the others run once
                break
    conc = [1] + args.concurrency
    head = " | ".join((f"{c} concurrent: tokens/s | p50 | p99" if c > 1 else "1 alone: tokens/s | latency") for c in conc)
    cols = sum(3 if c > 1 else 2 for c in conc)
    return report(f"/v1/score, texts of {args.chars:,} characters; the server's flags: {' '.join(extra + BENCH_FLAGS)}",
                  f"model | memory | precision | device | {head}", 4 + cols, rows, "bench_server.py")


def report(title, head, ncols, rows, script):
    """The markdown table (HEAD: its column names joined by " | ", NCOLS of
    them) of ROWS under TITLE, then the failures: the exit status."""
    print(f"\n{title}")
    print(f"| {head} |")
    print("| --- " * ncols + "|")
    for r in rows:
        print(r)
    if failures:
        print(f"FAIL {script}: {len(failures)} failure(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
