#!/usr/bin/env bash
# What the `nuvec serve` tests need beside the oracle: curl (the Debian package) and the
# pinned OpenAI and Anthropic Python SDKs in a venv of their own, keyed by the hash of the
# requirements file.
# Prints the venv's python, which scripts/test.sh exports as NUVEC_OPENAI_PYTHON.
#
#   NUVEC_OPENAI_PYTHON="$(scripts/setup-serve-tests.sh)"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export NUVEC_CACHE="${NUVEC_CACHE:-$HOME/.cache/nuvec}"
mkdir -p "$NUVEC_CACHE"
NUVEC_CACHE="$(cd "$NUVEC_CACHE" && pwd)"
log() { echo "[setup-serve-tests] $*" >&2; }

if ! command -v curl >/dev/null; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        log "installing curl"
        apt-get update -qq >&2 && apt-get install -y -qq curl >/dev/null
    else
        echo "error: the serve tests need curl; install it (apt-get install curl)" >&2
        exit 1
    fi
fi

REQ="$ROOT/scripts/serve/requirements.txt"
VENV="$NUVEC_CACHE/openai-venv-$(sha256sum "$REQ" | cut -c1-12)"
PY="$VENV/bin/python"
if [[ ! -f "$VENV/.installed" ]]; then
    log "creating $VENV"
    rm -rf "$VENV"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
            log "python3 -m venv failed; installing python3-venv"
            apt-get update -qq >&2 && apt-get install -y -qq python3-venv >/dev/null
            rm -rf "$VENV"
            python3 -m venv "$VENV"
        else
            echo "error: python3 -m venv failed; install python3-venv" >&2
            exit 1
        fi
    fi
    "$PY" -m pip install --quiet --disable-pip-version-check -r "$REQ" >&2
    touch "$VENV/.installed"
fi
echo "$PY"
