#!/bin/sh
# convert_fixtures.sh - the reference fixtures that come as a trainer's own
# checkpoint rather than a spanserve file, converted with clients/convert
# into BUILD/fixtures for the tests (tests/run.sh runs it first):
#   par-tf.safetensors  seed 004's TensorFlow checkpoint folder
#                       (../shared/fixtures/par-tf/checkpoint) with its
#                       SentencePiece model; needs tensorflow
# Says what it could not convert and why (the tests that need the file say
# SKIP); never fails the run by itself: test_convert_tf.sh tests the converter.
# Usage: tests/convert_fixtures.sh BUILD_DIR
build=${1:-build}
shared=${SPANSERVE_SHARED:-../shared}
mkdir -p "$build/fixtures"
src=$shared/fixtures/par-tf
out=$build/fixtures/par-tf.safetensors
rm -f "$out"
if [ ! -d "$src/checkpoint" ]; then
    echo "note: no $src (set SPANSERVE_SHARED): the seed's TensorFlow checkpoint is not converted"
elif ! python3 -c 'import tensorflow' >/dev/null 2>&1; then
    echo "note: tensorflow is not installed: the seed's TensorFlow checkpoint is not converted (pip install tensorflow-cpu==2.15.1)"
elif ! msg=$(python3 clients/convert "$src/checkpoint" "$out" --spm "$src/wiki2_12k.model" 2>&1); then
    echo "note: clients/convert could not convert $src/checkpoint: $(echo "$msg" | tail -n 3)"
    rm -f "$out"
fi
exit 0
