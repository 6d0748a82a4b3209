#!/bin/sh
# test_allattn.sh - runs tests/test_allattn.py (persistent memory through the server) for tests/run.sh.
exec python3 tests/test_allattn.py "$@"
