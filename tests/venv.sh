#!/bin/sh
# venv.sh - a python3 with the packages of tests/requirements.txt (the OpenAI
# client, jsonschema), for tests/run.sh: python3 itself when it has them,
# else a virtual environment in build/venv that sees the system's packages
# too, made once and filled from PyPI. Prints the directory to put first on
# PATH, or nothing when python3 will do or when the environment cannot be
# made (then says why on stderr, and the tests that need the packages say
# SKIP with the command to install them). Run from the repository's root.
venv=build/venv
has() { "$1" -c 'import openai, jsonschema' >/dev/null 2>&1; }
has python3 && exit 0
if [ -x "$venv/bin/python3" ] && has "$venv/bin/python3"; then echo "$PWD/$venv/bin"; exit 0; fi
if [ ! -x "$venv/bin/python3" ]; then
    # Debian keeps ensurepip, which venv needs, in python3-venv: deps.sh
    # installs it as root, else prints the command
    python3 -c 'import ensurepip' >/dev/null 2>&1 || sh deploy/deps.sh python3-venv >&2 || exit 0
    if ! python3 -m venv --system-site-packages "$venv" >&2; then
        echo "note: could not make $venv (python3 -m venv): the tests that need tests/requirements.txt say SKIP" >&2
        rm -rf "$venv"
        exit 0
    fi
fi
echo "venv: installing tests/requirements.txt into $venv" >&2
if ! "$venv/bin/python3" -m pip install -q --disable-pip-version-check -r tests/requirements.txt >&2; then
    echo "note: pip could not install tests/requirements.txt into $venv: the tests that need it say SKIP" >&2
    exit 0
fi
echo "$PWD/$venv/bin"
