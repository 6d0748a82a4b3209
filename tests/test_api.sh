#!/bin/sh
# test_api.sh - runs tests/test_api.py (the HTTP API against the real server) for tests/run.sh.
exec python3 tests/test_api.py "$@"
