#!/usr/bin/env bash
# The project's tests: installs the pinned oracle (mlx-lm), the real tokenizers and the default
# model, records mlx-lm's reference outputs (cached by content hash), curl, the OpenAI SDK and
# headless Chromium for the server's tests, Open MPI for the pipeline's ranks, then runs every
# Rust test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
NUVEC_CACHE="${NUVEC_CACHE:-$HOME/.cache/nuvec}"
export NUVEC_CACHE
# The chat test drives a real terminal through tmux.
if ! command -v tmux >/dev/null; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq tmux >/dev/null
    else
        echo "error: the chat test needs tmux; install it (apt-get install tmux)" >&2
        exit 1
    fi
fi
scripts/setup-oracle.sh >/dev/null
# shellcheck disable=SC1091
. "$NUVEC_CACHE/env.sh"
# curl and the pinned OpenAI SDK for the `nuvec serve` tests (crates/nuvec-cli/tests/serve.rs).
NUVEC_OPENAI_PYTHON="$(scripts/setup-serve-tests.sh)"
export NUVEC_OPENAI_PYTHON
# Debian's chromium and the pinned playwright-core for the chat page's browser test
# (crates/nuvec-cli/tests/serve_page.rs): exports NUVEC_CHROMIUM and NUVEC_PAGE_NODE_MODULES.
page_env="$(scripts/setup-page-tests.sh)"
eval "$page_env"
# Open MPI and libclang for the `mpi` feature: pipelines over real ranks (mpirun).
scripts/setup-mpi.sh
# The whole workspace with the `mpi` feature, unless packages are named (`scripts/test.sh -p
# nuvec-server -p nuvec-cli`: cargo's --workspace would override them; add `--features` there).
scope=(--workspace --features nuvec-cli/mpi)
for arg in "$@"; do
    case "$arg" in -p | --package | --package=* | -p?*) scope=() ;; esac
done
cargo test --release "${scope[@]}" "$@"
