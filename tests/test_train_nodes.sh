#!/bin/sh
# spanserve train --nodes: two processes of one GPU each standing in for two
# machines (skips with fewer than two GPUs).
exec python3 tests/test_train_nodes.py
