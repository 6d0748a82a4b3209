#!/usr/bin/env python3
"""
test_train_nodes.py - `spanserve train --nodes N --node-rank R --master
HOST:PORT` as README.md "Several GPUs" promises it, on the GPUs of this
machine standing in for machines: two processes of one GPU each
(CUDA_VISIBLE_DEVICES), NCCL between them over loopback.

- Two "machines" train what one process on both GPUs trains (--gpus 2):
  the logged losses and validation agree to float32's order of sums, and
  both machines log the same numbers.
- Only the first machine writes the checkpoint and state.
- A run stopped on two machines is resumed on one process (--gpus 2) and
  on one GPU, and ends where the uninterrupted run ends.
- SIGTERM to the second machine alone stops both after the same step, the
  first writing that step's checkpoint (exit status 3 on both).

Skips, saying so, with fewer than two GPUs or a build without the CUDA
trainer. Prints `FAIL check: reason` per failed check and ends with
`test_train_nodes.py: N passed, N failed`.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_jobs as TJ  # noqa: E402
from test_api import BIN, ROOT, free_port, gpu_count  # noqa: E402
from test_jobs import check  # noqa: E402

TEXT = os.path.join(ROOT, "tests/data/tiny_shakespeare.txt")


def lines(path, event):
    try:
        return [json.loads(x) for x in open(path) if f'"event":"{event}"' in x]
    except OSError:
        return []


def nodes(cfg, out, log, extra=(), steps=None, sig_after=None):
    """Both machines of a two-machine run; their exit statuses."""
    port = free_port()
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    procs = []
    for rank in (0, 1):
        cmd = [BIN, "train", "--config", cfg, "--device", "cuda", "--nodes", "2", "--node-rank", str(rank),
               "--master", f"127.0.0.1:{port}", "--out", out[rank], "--log", log[rank]] + list(extra)
        if steps:
            cmd += ["--steps", str(steps)]
        procs.append(subprocess.Popen(cmd, env=dict(env, CUDA_VISIBLE_DEVICES=str(rank)), stdout=subprocess.DEVNULL,
                                      stderr=open(log[rank] + ".err", "w")))
    if sig_after:
        # once the run is well under way, a stop on the second machine only
        deadline = time.time() + 120
        while time.time() < deadline and len(lines(log[0], "train")) < sig_after:
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGTERM)
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(300))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(None)
    return rcs


def main():
    n = gpu_count()
    if n < 2 or not os.path.exists(BIN):
        print(f"SKIP test_train_nodes.py: {'no ' + BIN if not os.path.exists(BIN) else f'this machine has {n} GPUs'} "
              "(two machines of one GPU each need two)")
        print("test_train_nodes.py: 0 passed, 0 failed")
        return 0
    tmp = tempfile.mkdtemp(prefix="test_train_nodes.")
    try:
        text = os.path.join(tmp, "text.txt")
        open(text, "w").write(open(TEXT).read()[:60000])
        cfg = os.path.join(tmp, "par.json")
        json.dump({"family": "par-transformer-xl", "data": text, "out": os.path.join(tmp, "x.safetensors"),
                   "n_blocks": 4, "n_head": 4, "d_model": 32, "d_head": 8, "d_inner": 64, "mem_len": 16,
                   "tgt_len": 16, "batch_size": 8, "steps": 40, "search_steps": 25, "log_every": 10,
                   "eval_every": 20, "eval_tokens": 2000, "checkpoint_every": 20, "lr": 0.003, "arch_lr": 0.05,
                   "dropout": 0.1, "dropatt": 0.1}, open(cfg, "w"))
        p = lambda name: os.path.join(tmp, name)  # noqa: E731
        # one process on both GPUs
        r = subprocess.run([BIN, "train", "--config", cfg, "--device", "cuda", "--gpus", "2", "--out", p("one.st"),
                            "--log", p("one.log")], env=dict(os.environ, NCCL_NVLS_ENABLE="0"), capture_output=True,
                           text=True, timeout=300)
        check("one process on 2 GPUs", r.returncode == 0, r.stderr[-400:])
        one = [x["loss"] for x in lines(p("one.log"), "train")]
        one_val = (lines(p("one.log"), "done") or [{}])[0].get("val_bpc")
        # two machines of one GPU
        rcs = nodes(cfg, [p("n0.st"), p("n1.st")], [p("n0.log"), p("n1.log")])
        check("two machines exit 0", rcs == [0, 0], f"{rcs}: {open(p('n0.log.err')).read()[-300:]} "
              f"{open(p('n1.log.err')).read()[-300:]}")
        n0 = [x["loss"] for x in lines(p("n0.log"), "train")]
        n1 = [x["loss"] for x in lines(p("n1.log"), "train")]
        start = lines(p("n0.log"), "start")
        check("machine 1 of 2", start and "machine 1 of 2" in start[0].get("device_name", ""), f"{start}")
        check("both machines log the same losses", n0 == n1 and len(n0) == 4, f"{n0} {n1}")
        check("as one process on both GPUs", len(n0) == len(one) and all(abs(a - b) <= 1e-3 * abs(b)
                                                                           for a, b in zip(n0, one)), f"{n0} {one}")
        v0 = (lines(p("n0.log"), "done") or [{}])[0].get("val_bpc")
        check("validation as one process", v0 and one_val and abs(v0 - one_val) <= 1e-3 * one_val, f"{v0} {one_val}")
        check("the first machine writes the checkpoint", os.path.exists(p("n0.st")) and os.path.exists(p("n0.st.state")),
              f"{os.listdir(tmp)}")
        check("the second writes none", not os.path.exists(p("n1.st")) and not os.path.exists(p("n1.st.state")),
              f"{os.listdir(tmp)}")
        # stopped at 20 on two machines (the state where both read it), resumed elsewhere
        rcs = nodes(cfg, [p("r.st"), p("r.st")], [p("r0.log"), p("r1.log")], steps=20)
        check("two machines to 20", rcs == [0, 0], f"{rcs}")
        # (a run keeps its checkpoint's path: each resume starts from a copy of the state at 20)
        shutil.copy(p("r.st"), p("keep.st"))
        shutil.copy(p("r.st.state"), p("keep.st.state"))
        for label, extra in (("one process on 2 GPUs", ["--gpus", "2"]), ("one GPU", [])):
            shutil.copy(p("keep.st"), p("r.st"))
            shutil.copy(p("keep.st.state"), p("r.st.state"))
            log = p(f"resumed-{len(extra)}.log")
            r = subprocess.run([BIN, "train", "--config", cfg, "--device", "cuda", "--resume", "--out", p("r.st"),
                                "--log", log] + extra, env=dict(os.environ, NCCL_NVLS_ENABLE="0"),
                               capture_output=True, text=True, timeout=300)
            v = (lines(log, "done") or [{}])[0].get("val_bpc")
            check(f"resumed on {label}", r.returncode == 0 and v and one_val and abs(v - one_val) <= 1e-3 * one_val,
                  f"{r.returncode} {v} {one_val} {r.stderr[-300:]}")
        # SIGTERM to the second machine only: both stop after the same step
        rcs = nodes(cfg, [p("s.st"), p("s.st")], [p("s0.log"), p("s1.log")], steps=100000, sig_after=2)
        s0, s1 = lines(p("s0.log"), "stopped"), lines(p("s1.log"), "stopped")
        check("a stop on one machine stops both", rcs == [3, 3] and s0 and s1 and s0[0]["step"] == s1[0]["step"],
              f"{rcs} {s0} {s1}")
        ck = lines(p("s0.log"), "checkpoint")
        check("the first machine wrote the stopped step's checkpoint", s0 and ck and ck[-1]["step"] == s0[0]["step"],
              f"{ck[-1:]} {s0}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_train_nodes.py: {TJ.PASS} passed, {TJ.FAIL} failed")
    return 1 if TJ.FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
