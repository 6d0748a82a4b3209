#!/usr/bin/env python3
"""
test_gpu_jobs.py - training jobs on the GPUs of the machine (`spanserve
serve --jobs-listen` with the CUDA trainer), as README.md "Training jobs"
promises them: --max-jobs is counted in GPUs, each GPU job is given GPUs of
its own (its CUDA_VISIBLE_DEVICES, shown as `gpu_ids` while it runs), a job
of `"gpus": 2` trains data parallel on two (its log names "2 x" the card),
a job waits while too few GPUs are free, and a job asking more GPUs than
the server runs at once is refused (400).

Skips, saying so, without a GPU build, without a GPU, or with one GPU (the
two-GPU checks). Uses test_jobs.py's server and helpers; a small PAR model
of a few hundred steps, seconds on a GPU.

Prints `FAIL check: reason` per failed check and ends with
`test_gpu_jobs.py: N passed, N failed`; exit status 1 on any failure.
"""
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_jobs as TJ  # noqa: E402
from test_api import gpu_count  # noqa: E402
from test_jobs import Server, upload, wait_for, check, TEXT, BIN  # noqa: E402

CONFIG = {"n_blocks": 4, "n_head": 2, "d_model": 32, "d_head": 16, "d_inner": 64, "mem_len": 16, "tgt_len": 16,
          "batch_size": 8, "steps": 400, "search_steps": 100, "log_every": 50, "eval_every": 200,
          "checkpoint_every": 200, "eval_tokens": 500}


def main():
    n = gpu_count()
    if n < 2:
        print(f"SKIP test_gpu_jobs.py: this machine has {n} GPU{'' if n == 1 else 's'} (the checks need two)")
        print("test_gpu_jobs.py: 0 passed, 0 failed")
        return 0
    tmp = tempfile.mkdtemp(prefix="test_gpu_jobs.")
    S = Server(tmp, max_jobs=2)
    try:
        err = S.start()
        if err:
            check("server", False, err)
            return 1
        r = upload(S, TEXT, name="text")
        check("upload", r.status == 201, f"{r}")
        fid = r.json["id"]
        # too many GPUs for the server (--max-jobs 2): refused, nothing queued
        r = S.j("POST", "/v1/jobs", {"family": "par-transformer-xl", "file": fid, "device": "cuda",
                                     "config": dict(CONFIG, gpus=3, batch_size=9)})
        check("3 GPUs refused", r.status == 400 and b"at most 2 GPUs" in r.body, f"{r}")
        # two one-GPU jobs at once: a GPU each
        for jid in ("one-a", "one-b"):
            r = S.j("POST", "/v1/jobs", {"id": jid, "family": "par-transformer-xl", "file": fid, "device": "cuda",
                                         "config": dict(CONFIG, steps=3000, checkpoint_every=3000)})
            check(f"{jid} submitted", r.status == 201, f"{r}")
        both = wait_for(lambda: all(S.job(j).get("status") == "running" and S.job(j).get("gpu_ids") for j in
                                    ("one-a", "one-b")) and [S.job(j)["gpu_ids"] for j in ("one-a", "one-b")], 60)
        check("two one-GPU jobs run together on different GPUs", both and sorted(both) == [[0], [1]], f"{both}")
        # a two-GPU job waits for both GPUs
        r = S.j("POST", "/v1/jobs", {"id": "two", "family": "par-transformer-xl", "file": fid, "device": "cuda",
                                     "config": dict(CONFIG, gpus=2)})
        check("two submitted", r.status == 201 and r.json.get("gpus") == 2, f"{r}")
        time.sleep(1)
        j = S.job("two")
        check("two waits while the GPUs are taken", j.get("status") == "queued" and "gpu_ids" not in j, f"{j}")
        for jid in ("one-a", "one-b"):
            S.j("POST", f"/v1/jobs/{jid}/cancel")
        ids = wait_for(lambda: S.job("two").get("gpu_ids"), 60)
        check("two gets both GPUs", ids == [0, 1], f"{S.job('two')}")
        done = S.wait_status("two", ("succeeded", "failed"), 180)
        check("two succeeds", done and done["status"] == "succeeded", f"{done} {S.tail()}")
        ev = TJ.log_events(S, "two")
        start = [e for e in ev if e.get("event") == "start"]
        check("two trained on 2 GPUs", start and str(start[0].get("device_name", "")).startswith("2 x "), f"{start}")
        check("two's GPUs are free again", "gpu_ids" not in S.job("two"), f"{S.job('two')}")
    finally:
        S.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_gpu_jobs.py: {TJ.PASS} passed, {TJ.FAIL} failed")
    return 1 if TJ.FAIL else 0


if __name__ == "__main__":
    if not os.path.exists(BIN):
        print(f"SKIP test_gpu_jobs.py: no {BIN}")
        print("test_gpu_jobs.py: 0 passed, 0 failed")
        sys.exit(0)
    sys.exit(main())
