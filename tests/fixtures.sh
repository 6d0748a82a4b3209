# fixtures.sh - where the shell tests find the reference data (sourced from
# the repository's root; tests/harness.h's ref_path and test_api.py's follow
# the same rule). The small fixtures and the text they were trained on come
# from $SPANSERVE_SHARED (default ../shared) when it has them, else from the
# copies under tests/ (tests/fixtures/README.md); what only ../shared has
# (the larger fixtures) is shared_path's, and a test without it says SKIP.
shared=${SPANSERVE_SHARED:-../shared}
# ref_path REL: $shared/REL if it is there, else tests/REL
ref_path() { if [ -e "$shared/$1" ]; then echo "$shared/$1"; else echo "tests/$1"; fi; }
# shared_path REL: $shared/REL, or nothing (status 1) when it is not there
shared_path() { [ -e "$shared/$1" ] && echo "$shared/$1"; }
A=$(ref_path fixtures/aspan-small/model.safetensors)
P=$(ref_path fixtures/par-small/model.safetensors)
TEXT=$(ref_path data/tiny_shakespeare.txt)
