#!/usr/bin/env bash
# The project's tests: installs the pinned oracle (mlx-lm), the real tokenizers and the default
# model, records mlx-lm's reference outputs (cached by content hash), then runs every Rust test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
NUVEC_CACHE="${NUVEC_CACHE:-$HOME/.cache/nuvec}"
export NUVEC_CACHE
scripts/setup-oracle.sh >/dev/null
# shellcheck disable=SC1091
. "$NUVEC_CACHE/env.sh"
cargo test --release --workspace "$@"
