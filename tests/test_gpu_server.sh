#!/bin/sh
# The server on the GPU against the server on the CPU (skips without a GPU).
exec python3 tests/test_gpu_server.py
