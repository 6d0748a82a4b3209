#!/bin/sh
# test_jobs.sh - runs tests/test_jobs.py (training jobs over HTTP against the real server) for tests/run.sh.
exec python3 tests/test_jobs.py "$@"
