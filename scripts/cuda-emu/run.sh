#!/usr/bin/env bash
# Checks the logic of the Gated DeltaNet / gpt-oss CUDA kernels, of the attention kernels'
# sinks, of split attention reading its kv length from a CUDA graph's step scalars (bit-identical
# to the eager launch), of the 4-bit one-row GEMVs (linear.cu: qgemv.cpp) and of the flash-attention
# prefill kernels (flash_attention.cu: attn.cpp) on the CPU: the kernel sources (common.cuh prelude patched for the host: f16 conversion
# in C instead of PTX, dynamic shared memory as a static array) compiled with g++ over
# cuda_emu.h, run on small random cases against the ops' definitions. Needs g++ with C++20
# (std::barrier); about a minute on 2 cores (a thread per CUDA thread). Exits non-zero on a
# mismatch. Usage: scripts/cuda-emu/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
k="$here/../../crates/nuvec/src/backends/cuda/kernels"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
{
    echo '#include "cuda_emu.h"'
    sed 's/asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));/f = emu_half_to_float(h);/' "$k/common.cuh"
    cat "$k/gated_delta.cu" "$k/gpt_oss.cu"
    sed 's/extern __shared__ float smem\[\];/float* smem = emu_dyn_smem;/' "$k/attention.cu"
} >"$work/kernels.cpp"
grep -q emu_half_to_float "$work/kernels.cpp" && grep -q emu_dyn_smem "$work/kernels.cpp" \
    || { echo "cuda-emu: the host patches no longer apply to the kernel sources" >&2; exit 1; }
cp "$here/cuda_emu.h" "$here/emu_check.h" "$here/harness.cpp" "$work/"
g++ -std=c++20 -O1 -w -pthread "$work/harness.cpp" -o "$work/harness"
"$work/harness"
# The 4-bit one-row GEMV kernels and the gated MLP fusion (linear.cu), in a second program:
# qgemv.cpp.
{
    echo '#include "cuda_emu.h"'
    sed 's/asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));/f = emu_half_to_float(h);/' "$k/common.cuh"
    cat "$k/linear.cu"
} >"$work/kernels_linear.cpp"
cp "$here/qgemv.cpp" "$work/"
g++ -std=c++20 -O1 -w -pthread "$work/qgemv.cpp" -o "$work/qgemv"
"$work/qgemv"
# The row kernels (norms, argmax) of elementwise.cu and fused.cu, in a third program: rows.cpp.
{
    echo '#include "cuda_emu.h"'
    sed 's/asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));/f = emu_half_to_float(h);/' "$k/common.cuh"
    cat "$k/elementwise.cu"
    sed 's/extern __shared__ float rope_cs\[\];/float* rope_cs = emu_dyn_smem;/' "$k/fused.cu"
} >"$work/kernels_rows.cpp"
grep -q 'float\* rope_cs = emu_dyn_smem' "$work/kernels_rows.cpp" \
    || { echo "cuda-emu: the host patch no longer applies to fused.cu" >&2; exit 1; }
cp "$here/rows.cpp" "$work/"
g++ -std=c++20 -O1 -w -pthread "$work/rows.cpp" -o "$work/rows"
"$work/rows"

# The flash-attention prefill kernels (flash_attention.cu), in a fourth program: attn.cpp.
{
    echo '#include "cuda_emu.h"'
    sed 's/asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));/f = emu_half_to_float(h);/' "$k/common.cuh"
    sed 's/extern __shared__ __align__(16) u16 fa_smem\[\];/u16* const fa_smem = (u16*)emu_dyn_smem;/' "$k/flash_attention.cu"
} >"$work/kernels_attn.cpp"
grep -q 'fa_smem = (u16\*)emu_dyn_smem' "$work/kernels_attn.cpp" \
    || { echo "cuda-emu: the host patch no longer applies to flash_attention.cu" >&2; exit 1; }
cp "$here/attn.cpp" "$work/"
g++ -std=c++20 -O1 -w -pthread "$work/attn.cpp" -o "$work/attn"
"$work/attn"
