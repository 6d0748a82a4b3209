#!/bin/sh
# test_reliability.sh - runs tests/test_reliability.py (issue 12: unloads under load, crashes, a full disk,
# cancelled requests, hostile clients and files) for tests/run.sh.
exec python3 tests/test_reliability.py "$@"
