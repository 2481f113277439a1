#!/usr/bin/env bash
# Checks the logic of CUDA kernels on the CPU, in eight programs: the Gated DeltaNet / gpt-oss
# kernels, the attention kernels' sinks and split attention reading its kv length from a CUDA
# graph's step scalars (bit-identical to the eager launch) (harness.cpp); the 4-bit one-row GEMVs
# (linear.cu: qgemv.cpp); the row kernels (rows.cpp); the few-row quantized products on the
# tensor cores (qmma.cu: qmma.cpp) and in integers (qimma.cu: qimma.cpp); the flash-attention prefill kernels
# (flash_attention.cu: attn.cpp); the mixture-of-experts kernels (moe.cu, moe_router.cu, qmma.cu's grouped
# products, linear.cu's xsplit_f32 for the integer ones: moe.cpp); the quantized keys and values of
# a paged cache (kv_quant.cu: kvq.cpp). The kernel sources (common.cuh patched for the host: f16
# conversion in C instead of PTX, dynamic shared memory as a static array) are compiled with g++
# over cuda_emu.h and run on small random cases against the ops' definitions. Needs g++ with
# C++20 (std::barrier); a few minutes on 2 cores (a thread per CUDA thread). Exits non-zero on a
# mismatch. Usage: scripts/cuda-emu/run.sh [PROGRAM...] (e.g. `harness kvq`; all eight without).
set -euo pipefail
only="$*"
here="$(cd "$(dirname "$0")" && pwd)"
k="$here/../../crates/nuvec/src/backends/cuda/kernels"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$here/cuda_emu.h" "$here/emu_check.h" "$work/"

# Kernel source $1 through the sed expression $2 (a host patch); stops the run when the
# expression no longer changes the source.
patched() {
    local out
    out="$(sed "$2" "$1")"
    if [ "$out" = "$(cat "$1")" ]; then
        echo "cuda-emu: the host patch no longer applies to $(basename "$1")" >&2
        exit 1
    fi
    printf '%s\n' "$out"
}
# What every program's kernels file starts with: the emulation, then common.cuh with its f16
# conversion in C instead of PTX.
prelude() {
    echo '#include "cuda_emu.h"'
    patched "$k/common.cuh" 's/asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));/f = emu_half_to_float(h);/;s/asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));/h = emu_float_to_half(f);/'
}
# Program $1.cpp (which includes the kernels file written before it) built and run; with
# program names as arguments, only those.
run_program() {
    if [ "$#" -gt 0 ] && [ -n "$only" ] && [[ " $only " != *" $1 "* ]]; then
        echo "cuda-emu: $1 skipped"
        return
    fi
    cp "$here/$1.cpp" "$work/"
    g++ -std=c++20 -O1 -w -pthread "$work/$1.cpp" -o "$work/$1"
    "$work/$1"
}

# Gated DeltaNet, gpt-oss and the attention kernels: harness.cpp.
{
    prelude
    cat "$k/gated_delta.cu" "$k/gpt_oss.cu"
    patched "$k/attention.cu" 's/extern __shared__ float smem\[\];/float* smem = emu_dyn_smem;/'
} >"$work/kernels.cpp"
run_program harness
# The 4-bit one-row GEMV kernels and the gated MLP fusion (linear.cu): qgemv.cpp.
{
    prelude
    cat "$k/linear.cu"
} >"$work/kernels_linear.cpp"
run_program qgemv
# The row kernels (norms, rope, argmax) of elementwise.cu and fused.cu: rows.cpp.
{
    prelude
    cat "$k/elementwise.cu"
    patched "$k/fused.cu" 's/extern __shared__ float rope_cs\[\];/float* rope_cs = emu_dyn_smem;/'
} >"$work/kernels_rows.cpp"
run_program rows
# The few-row quantized products on the tensor cores (qmma.cu): qmma.cpp.
{
    prelude
    patched "$k/qmma.cu" 's/extern __shared__ __align__(16) unsigned char qm_smem\[\];/unsigned char* const qm_smem = (unsigned char*)emu_dyn_smem;/'
} >"$work/kernels_qmma.cpp"
run_program qmma
# The few-row 4-bit products in integers (qimma.cu, over linear.cu's xsplit_f32): qimma.cpp.
{
    prelude
    cat "$k/linear.cu"
    patched "$k/qimma.cu" 's/extern __shared__ __align__(16) unsigned char qi_smem\[\];/unsigned char* const qi_smem = (unsigned char*)emu_dyn_smem;/'
} >"$work/kernels_qimma.cpp"
run_program qimma
# The flash-attention prefill kernels (flash_attention.cu): attn.cpp.
{
    prelude
    patched "$k/flash_attention.cu" 's/extern __shared__ __align__(16) u16 fa_smem\[\];/u16* const fa_smem = (u16*)emu_dyn_smem;/'
} >"$work/kernels_attn.cpp"
run_program attn
# The mixture-of-experts kernels (moe.cu, moe_router.cu, qmma.cu's grouped products, linear.cu's xsplit_f32): moe.cpp.
{
    prelude
    patched "$k/qmma.cu" 's/extern __shared__ __align__(16) unsigned char qm_smem\[\];/unsigned char* const qm_smem = (unsigned char*)emu_dyn_smem;/'
    cat "$k/linear.cu" "$k/moe.cu" "$k/moe_router.cu"
} >"$work/kernels_moe.cpp"
run_program moe
# The quantized keys and values of a paged cache (kv_quant.cu) and the paged decode over them
# (attention.cu): kvq.cpp.
{
    prelude
    cat "$k/kv_quant.cu"
    patched "$k/attention.cu" 's/extern __shared__ float smem\[\];/float* smem = emu_dyn_smem;/'
} >"$work/kernels_kvq.cpp"
run_program kvq
