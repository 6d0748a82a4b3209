#!/usr/bin/env python3
"""bench_generate.py - generation through the HTTP server (issue 17's
`make bench` line): the real server (SPANSERVE_BIN, default bin/spanserve)
serving one model at a time, then

  1 stream alone   one POST /v1/generate with "stream": true (Server-Sent
                   Events, a token at a time) of --tokens tokens: the time
                   to the first token (from the request sent) and tokens/s
                   (from the first token to the last);
  N streams        --sessions such requests at once, each on its own
                   connection, started together: tokens/s (all tokens over
                   the time from the first request sent to the last token
                   read), each token's gap after the one before in its
                   stream (p50 and p99 over every stream) and the time to
                   the first token (p50, p99).

Each generation samples (temperature 1, top_p 0.9, its own seed) from the
prompt "ROMEO:" with no stop string, so it must end after exactly --tokens
tokens: a token event each, then one done event with finish_reason "length";
anything else prints FAIL and exits 1. A warm-up request (not timed) runs
first. Ends with a markdown table, a row per model, memory mode and server
environment.

    tests/bench_generate.py [options] [NAME=]MODEL.safetensors ...

    --memory exact,span   adaptive-span memory modes (a server each; other
                          families run once); default span
    --sessions N          streams of the second round (default 64)
    --tokens N            tokens a generation (default 500)
    --decode-kernel       also run each model with SPANSERVE_GPU_DECODE_KERNEL=0
                          (decode steps as CUDA graphs) and =1 (every step of
                          up to 8 sessions as one kernel) in the server's
                          environment; the first run leaves it unset (auto:
                          kernels/gpu.h)
    --quick               --tokens 40 --sessions 4: a CPU check
env SPANSERVE_SERVE_ARGS  more `spanserve serve` flags, split on spaces
                          (on the GPU: "--device cuda --precision bf16")

The server, its flags and the helpers are bench_server.py's (--max-step-gflop
1000000, so that the scheduler alone batches every stream).
"""
import argparse, json, os, sys, threading, time, http.client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_server import BENCH_FLAGS, Server, fail, percentile, report  # noqa: E402

PROMPT = "ROMEO:"


def stream_generate(srv, model, tokens, seed, start, out):
    """One streamed generation after START (a threading.Event, or None): into
    OUT the send time, each token event's arrival time and the done event."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=600)
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 1.0, "top_p": 0.9,
                       "seed": seed, "stream": True}).encode()
    times, done, event = [], None, "message"
    try:
        if start:
            start.wait()
        t0 = time.perf_counter()
        c.request("POST", "/v1/generate", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            out.update(error=f"{r.status} {r.read()[:300]!r}")
            return
        while True:
            line = r.fp.readline()
            if not line:
                break
            line = line.decode("utf-8", "replace").rstrip("\r\n")
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                if event == "token":
                    times.append(time.perf_counter())
                elif event == "done":
                    done = json.loads(line[5:])
                elif event == "error":
                    out.update(error=line[5:300])
            elif line == "":
                event = "message"
            if done is not None:
                break
        out.update(t0=t0, times=times, done=done)
    except (OSError, ValueError) as e:
        out.update(error=str(e))
    finally:
        c.close()


def check(name, res, tokens):
    """Whether the generation RES is whole (else a FAIL line)."""
    if res.get("error"):
        fail(f"{name}: {res['error']}")
        return False
    done = res.get("done") or {}
    if len(res.get("times", [])) != tokens or done.get("finish_reason") != "length":
        fail(f"{name}: {len(res.get('times', []))} token events of {tokens}, finish_reason {done.get('finish_reason')!r}")
        return False
    return True


def bench_one(path, mode, args, extra, kernel):
    """One server, one model: the two rounds, with SPANSERVE_GPU_DECODE_KERNEL
    set to KERNEL ("0" or "1"; None leaves it unset: auto). Returns the table
    row (None when the server did not start) and the model's family."""
    name, _, path = path.rpartition("=") if "=" in path else (os.path.basename(path).rsplit(".", 1)[0], "", path)
    flags = extra + BENCH_FLAGS + (["--memory", mode] if mode else [])
    env_was = os.environ.pop("SPANSERVE_GPU_DECODE_KERNEL", None)
    if kernel is not None:
        os.environ["SPANSERVE_GPU_DECODE_KERNEL"] = kernel
    try:
        srv = Server(name, path, flags)
    except RuntimeError as e:
        fail(f"{name}: {e}")
        return None, None
    finally:
        os.environ.pop("SPANSERVE_GPU_DECODE_KERNEL", None)
        if env_was is not None:
            os.environ["SPANSERVE_GPU_DECODE_KERNEL"] = env_was
    env = f"SPANSERVE_GPU_DECODE_KERNEL={kernel}" if kernel is not None else "-"
    try:
        st, info = srv.call("GET", f"/v1/models/{name}")
        if st != 200:
            fail(f"{name}: GET /v1/models/{name}: {st} {info!r}")
            return None, None
        family, device, prec = info.get("family"), info.get("device"), info.get("precision")
        memory = (info.get("memory") or {}).get("mode", "-") if family == "adaptive-span" else "-"
        taken = [l for l in srv.output().splitlines() if "decode steps" in l]
        print(f"\n{name}: {family}, memory {memory}, {device}, {prec}; environment {env}; serve flags: {' '.join(flags)}"
              + (f"\n  {taken[0]}" if taken else ""), flush=True)
        warm = {}
        stream_generate(srv, name, min(args.tokens, 50), 1, None, warm)   # first steps of each shape, not timed
        check(name, warm, min(args.tokens, 50))
        one = {}
        stream_generate(srv, name, args.tokens, 2, None, one)
        row1 = "- | -"
        if check(name, one, args.tokens):
            ttft = one["times"][0] - one["t0"]
            span = one["times"][-1] - one["times"][0]
            rate = (args.tokens - 1) / span if span > 0 else 0
            print(f"    1 alone: {args.tokens} tokens, first after {ttft * 1e3:.1f} ms, then {rate:,.0f} tokens/s", flush=True)
            row1 = f"{rate:,.0f} | {ttft * 1e3:.1f} ms"
        n = args.sessions
        outs = [{} for _ in range(n)]
        start = threading.Event()
        th = [threading.Thread(target=stream_generate, args=(srv, name, args.tokens, 100 + i, start, outs[i]))
              for i in range(n)]
        for t in th:
            t.start()
        time.sleep(0.2)   # every thread waiting on START
        start.set()
        for t in th:
            t.join()
        rowN = "- | - | - | -"
        if all(check(f"{name} stream {i}", o, args.tokens) for i, o in enumerate(outs)):
            t0 = min(o["t0"] for o in outs)
            t1 = max(o["times"][-1] for o in outs)
            gaps = [b - a for o in outs for a, b in zip(o["times"], o["times"][1:])]
            ttfts = [o["times"][0] - o["t0"] for o in outs]
            rate = n * args.tokens / (t1 - t0)
            print(f"  {n:3d} at once: {n * args.tokens:,} tokens in {t1 - t0:.2f} s: {rate:,.0f} tokens/s; a token "
                  f"after the one before p50 {percentile(gaps, 50) * 1e3:.2f} ms, p99 {percentile(gaps, 99) * 1e3:.2f} "
                  f"ms; first token p50 {percentile(ttfts, 50) * 1e3:.1f} ms, p99 {percentile(ttfts, 99) * 1e3:.1f} ms",
                  flush=True)
            rowN = (f"{rate:,.0f} | {percentile(gaps, 50) * 1e3:.2f} ms | {percentile(gaps, 99) * 1e3:.2f} ms | "
                    f"{percentile(ttfts, 50) * 1e3:.1f} ms")
    finally:
        srv.stop()
    return f"| {name} | {memory} | {prec} | {device} | {env} | {row1} | {rowN} |", family


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--memory", default="span")
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--decode-kernel", action="store_true")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.sessions = 40, 4
    if args.tokens < 2 or args.sessions < 1:
        ap.error("--tokens must be at least 2 and --sessions at least 1")
    extra = os.environ.get("SPANSERVE_SERVE_ARGS", "").split()
    rows = []
    for path in args.models:
        for kernel in ([None, "0", "1"] if args.decode_kernel else [None]):
            for mode in [m for m in args.memory.split(",") if m] or ["span"]:
                row, family = bench_one(path, mode, args, extra, kernel)
                if row:
                    rows.append(row)
                if family != "adaptive-span":   # the memory modes are adaptive-span's: the others run once
                    break
    n = args.sessions
    return report(f"/v1/generate, streamed, {args.tokens} tokens a generation (temperature 1, top_p 0.9); the server's "
                  f"flags: {' '.join(extra + BENCH_FLAGS)}",
                  f"model | memory | precision | device | environment | 1 alone: tokens/s | first token | {n} at once: "
                  f"tokens/s | a token after the one before, p50 | p99 | first token p50", 11, rows, "bench_generate.py")

if __name__ == "__main__":
    sys.exit(main())
