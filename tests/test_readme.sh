#!/bin/sh
# Every shell example of README.md, in order, against the servers it
# describes (tests/test_readme.py says how).
exec python3 tests/test_readme.py "$@"
