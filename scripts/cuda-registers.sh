#!/usr/bin/env bash
# Registers, spills and static shared memory of CUDA kernels, without a GPU: compiles one kernel
# source of nuvec's CUDA backend for sm_90 with NVRTC (the pinned PyPI wheel that
# scripts/check-cuda-kernels.sh installs) and ptxas's verbose report, and prints its lines for
# the kernels whose names match a pattern. Extra arguments go to NVRTC (definitions such as
# -DQI_STAGES=2, as NUVEC_NVRTC_DEFINES passes them at run time).
# Usage: scripts/cuda-registers.sh qimma.cu [PATTERN] [-DNAME=VALUE ...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${NUVEC_CACHE:-$HOME/.cache/nuvec}/nvrtc-13.0.88"
if [ ! -x "$venv/bin/python" ]; then
    "$root/scripts/check-cuda-kernels.sh" >/dev/null  # installs the wheel
fi
source="${1:?usage: scripts/cuda-registers.sh SOURCE.cu [PATTERN] [-DNAME=VALUE ...]}"
pattern="${2:-.}"
shift $(($# < 2 ? $# : 2))
exec "$venv/bin/python" - "$root/crates/nuvec/src/backends/cuda/kernels" "$root/scripts" "$source" "$pattern" "$@" <<'PY'
import os, re, sys

kernels, name, pattern, extra = sys.argv[1], sys.argv[3], sys.argv[4], sys.argv[5:]
sys.path.insert(0, sys.argv[2])
from nvrtc_wheel import compile_src, load, source

nvrtc, _ = load("cuda-registers")
if not os.path.exists(os.path.join(kernels, name)):
    sys.exit(f"cuda-registers: no kernel source {os.path.join(kernels, name)}")
ok, text, _ = compile_src(nvrtc, name, source(kernels, name), ["--gpu-architecture=sm_90", "--std=c++17", "--ptxas-options=-v"] + extra)
if not ok:
    sys.exit(f"cuda-registers: NVRTC could not compile {name}:\n{text}")
kernel = None
for line in text.splitlines():
    m = re.search(r"Compiling entry function '(\w+)'", line)
    if m:
        kernel = m.group(1)
    elif kernel and re.search(pattern, kernel) and ("registers" in line or "spill" in line):
        detail = re.sub(r"^ptxas( info)?\s*[:.]?\s*", "", line.strip())
        print(f"{kernel:28} {detail}")
PY
