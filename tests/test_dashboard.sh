#!/bin/sh
# test_dashboard.sh - runs tests/test_dashboard.py (the dashboard in headless Chromium) for tests/run.sh.
exec python3 tests/test_dashboard.py "$@"
