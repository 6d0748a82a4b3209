#!/bin/sh
# test_gpt.sh - runs tests/test_gpt.py (GPT-style window models through the server) for tests/run.sh.
exec python3 tests/test_gpt.py "$@"
