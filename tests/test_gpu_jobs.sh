#!/bin/sh
# Training jobs on the machine's GPUs: one GPU a job, a two-GPU job data
# parallel (skips with fewer than two GPUs).
exec python3 tests/test_gpu_jobs.py
