#!/bin/sh
# test_attention.sh - runs tests/test_attention.py (POST /v1/attention through the server) for tests/run.sh.
exec python3 tests/test_attention.py "$@"
