#!/bin/sh
# Installs the system packages that building and testing spanserve need, on
# Debian or Ubuntu: with apt-get when run as root, otherwise it prints the
# exact command and stops. Quiet and quick when everything is there.
#   sh deploy/deps.sh [PACKAGE...]   # also these Debian packages (tests/venv.sh
#                                    # asks for python3-venv when it needs it)
set -e
need=""
for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"; done
have_pc() { pkg-config --exists "$1" 2>/dev/null; }
{ command -v cc && command -v g++; } >/dev/null 2>&1 || need="$need build-essential"
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
have_pc jansson || need="$need libjansson-dev"
have_pc openblas || need="$need libopenblas-dev"
have_pc libmicrohttpd || need="$need libmicrohttpd-dev"
have_pc libcurl || need="$need libcurl4-openssl-dev"
have_pc sentencepiece || need="$need libsentencepiece-dev"   # SentencePiece models' tokenizer
command -v curl >/dev/null 2>&1 || need="$need curl"
command -v python3 >/dev/null 2>&1 || need="$need python3"
command -v openssl >/dev/null 2>&1 || need="$need openssl"   # the tests' https server's certificate
[ -z "$need" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "deps: installing$need"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $need >/dev/null
else
    echo "spanserve needs these packages:$need"
    echo "install them with:"
    echo "    sudo apt-get update && sudo apt-get install -y$need"
    exit 1
fi
