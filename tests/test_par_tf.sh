#!/bin/sh
# test_par_tf.sh - runs tests/test_par_tf.py (seed 004's TensorFlow PAR Transformer-XL through the server) for tests/run.sh.
exec python3 tests/test_par_tf.py "$@"
