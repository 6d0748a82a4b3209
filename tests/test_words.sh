#!/bin/sh
# test_words.sh - runs tests/test_words.py (a word-level Transformer-XL through the server) for tests/run.sh.
exec python3 tests/test_words.py "$@"
