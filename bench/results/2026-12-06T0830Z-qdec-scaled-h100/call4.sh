#!/bin/bash
# Session 47, call 4: NVRTC over the kernel sources on this host (bench/cuda/nvrtc_time.py, its
# threaded run now checked), cuda_bf16 whole, and gpu_parity_bf16's GGUF batched decode test
# (gguf_kquants_batched_decode_auto, 12 and 20 sequences under Auto) beside the two it sits with.
cd "$(dirname "$0")/../../.."
B=/tmp/b; mkdir -p $B /tmp/fx && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)|MHz"
export NUVEC_GPU_FIXTURES=/tmp/fx
timeout 150 python3 bench/cuda/nvrtc_time.py crates/nuvec/src/backends/cuda/kernels 2>&1
t() { local s=$1; shift; local s0=$(date +%s); echo "== $*"; (cd $B && timeout $s "$@" 2>&1 | grep -E "^test .*(FAIL|ok$)|test result|panicked|differ|margin|RESULT|rror" | head -40); echo "   ($(( $(date +%s) - s0 )) s)"; }
t 200 ./cuda_bf16 --test-threads=2
echo "kernel cache entries: $(ls ~/.cache/nuvec/cuda-kernels 2>/dev/null | wc -l)"
t 120 ./gpu_parity_bf16 --test-threads=1 --nocapture gguf_kquants_batched_decode_auto q4_batched_decode_forced_bf16 gguf_kquants_prefill_auto
echo done
