#!/usr/bin/env bash
# Compiles every CUDA kernel source of nuvec's CUDA backend with NVRTC, on the CPU (no GPU and no
# CUDA install needed): NVRTC comes from PyPI's nvidia-cuda-nvrtc wheel (pinned), called through
# ctypes. Each source is compiled exactly as the backend does at run time (prelude + source,
# `--gpu-architecture=compute_90 --std=c++17`, giving PTX), and again for sm_90 (machine code,
# so ptxas errors show too), then both for sm_90a (what an H100 / H200 compiles: the warpgroup
# MMA); every `extern "C" __global__` kernel must appear in the PTX and start with
# `pdl_begin();` (or an L2 prefetch first: linear.cu's *_BEGIN macros, attention.cu's atts_prefetch).
# Exits non-zero if anything fails. Usage: scripts/check-cuda-kernels.sh
set -euo pipefail

NVRTC_VERSION=13.0.88
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${NUVEC_CACHE:-$HOME/.cache/nuvec}"
venv="$cache/nvrtc-$NVRTC_VERSION"

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -m pip show -q "nvidia-cuda-nvrtc" >/dev/null 2>&1; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "nvidia-cuda-nvrtc==$NVRTC_VERSION"
fi

exec "$venv/bin/python" - "$root/crates/nuvec/src/backends/cuda/kernels" "$root/scripts" <<'PY'
import ctypes, glob, os, re, sys

kernels = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from nvrtc_wheel import compile_src, load, source

nvrtc, lib = load("check-cuda-kernels")
major, minor = ctypes.c_int(), ctypes.c_int()
nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
print(f"NVRTC {major.value}.{minor.value} ({lib})")

# Must match crates/nuvec/src/backends/cuda/mod.rs: SOURCES, kernel_sources(), nvrtc_options().
sources = sorted(glob.glob(os.path.join(kernels, "*.cu")))
if not sources:
    sys.exit(f"check-cuda-kernels: no .cu files in {kernels}")
failed = 0
for path in sources:
    name = os.path.basename(path)
    body = open(path).read()
    src = source(kernels, name)
    names = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(', body)
    # compute_90a and sm_90a: what an H100 / H200 runs (the qwg kernels' warpgroup MMA).
    for arch in ("compute_90", "sm_90", "compute_90a", "sm_90a"):
        ok, log, ptx = compile_src(nvrtc, name, src, [f"--gpu-architecture={arch}", "--std=c++17"])
        missing = [k for k in names if ok and arch.startswith("compute") and f".entry {k}(" not in ptx]
        status = "ok" if ok and not missing else "FAILED"
        print(f"{status:6} {name:18} {arch:10} kernels: {', '.join(names)}")
        if log.strip():
            print(log.rstrip())
        if missing:
            print(f"       kernels missing from the PTX: {missing}")
        failed += status != "ok"

def body_start(text, at):
    """Index just past the `{` that opens the body of the kernel declared at `at`: after the
    parameter list's closing parenthesis (skipping __launch_bounds__(...))."""
    i = text.index("(", at)
    if "__launch_bounds__" in text[at:i]:
        i = text.index("(", text.index(")", i) + 1)
    depth = 0
    while True:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            break
        i += 1
    return text.index("{", i) + 1

# Every kernel starts with pdl_begin() (common.cuh): the backend launches kernels with
# programmatic stream serialization, so a kernel that touched memory before it could race with
# the kernel before it on the stream. The 4-bit GEMVs start with QG4_BEGIN / QGM4_BEGIN /
# GUS_BEGIN (linear.cu), the few-row products with QM_BEGIN (qmma.cu) and QI_BEGIN (qimma.cu), and the decode attention
# split with atts_prefetch: an L2 prefetch of what they will read (a hint, which cannot race),
# then pdl_begin (the router's product: moe_router_prefetch); the few-row register kernels (qimma_reg, qdec_reg, qwg_reg) copy
# their first weights, scales and biases, which no kernel writes, into shared memory first.
starts = ("pdl_begin();", "atts_prefetch(", "QG4_BEGIN(", "QGM4_BEGIN(", "GUS_BEGIN(", "QM_BEGIN(", "QI_BEGIN(", "qimma_reg<", "qdec_reg<", "qwg_reg<", "moe_router_prefetch(")
checks = 0
for path in sources:
    name, body = os.path.basename(path), open(path).read()
    for m in re.finditer(r'extern "C" __global__', body):
        checks += 1
        if not body[body_start(body, m.end()):].lstrip().startswith(starts):
            line = body.count("\n", 0, m.start()) + 1
            print(f"FAILED {name}:{line}: the kernel does not start with pdl_begin();")
            failed += 1
print(f"{2 * len(sources) + checks - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
