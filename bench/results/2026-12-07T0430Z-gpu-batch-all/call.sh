#!/bin/bash
# Session 54: main 08232b0 built for CUDA (bins10: cuda_ops, gpu_batch, gpu_parity, cuda_graphs, nuvec), then the script
# session 53 could not run (its call2.sh): every gpu_batch case: the fixtures call 1 lacked are
# carried (qwen3-q4g64, moe_bf16/qwen3_moe-bf16q4) or made here (random-tiny-q4, random-small-q4,
# scripts/make-random-checkpoint.py), so the batched paths the per-device knobs pick (bf16 register
# kernels, warpgroup kernels, grouped MoE, tensor-core paged decode, shared prefixes) run against
# each sequence alone; then cuda_graphs' qwen3 case.
cd "$(dirname "$0")/../../.."
B=/tmp/b; G=/tmp/gfx; mkdir -p $B /tmp/fx $G $OUT/raw
tar -C $B -xJf .gpu-run/bins10.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz && tar -C $G -xJf .gpu-run/gfx.tar.xz && tar -C $G -xJf .gpu-run/q3.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for s in tiny small; do python3 scripts/make-random-checkpoint.py $G/random-$s-q4 --shape $s --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk-$s.log 2>&1; echo "mk $s rc $?"; done
export NUVEC_GPU_FIXTURES=$G
(cd $B && timeout 150 ./gpu_batch --test-threads=1 --nocapture > $OUT/raw/gpu_batch-all.log 2>&1; echo "rc $?")
grep -E "^test |test result|RESULT|panicked" $OUT/raw/gpu_batch-all.log | head -60
[[ -n $ONLY_BATCH ]] && { echo done; exit 0; }
(cd $B && NUVEC_QDEC_WGMMA=1 timeout 60 ./gpu_batch --test-threads=1 --nocapture bf16_scaled_4bit_wide > $OUT/raw/gpu_batch-wgmma.log 2>&1; echo "wgmma rc $?")
grep -E "test result|RESULT|panicked" $OUT/raw/gpu_batch-wgmma.log | head -6
(cd $B && timeout 60 ./cuda_graphs --test-threads=1 --exact graphs_equal_eager_qwen3_q4 > $OUT/raw/cuda_graphs-qwen3.log 2>&1; echo "graphs rc $?")
grep -E "test result|RESULT|panicked" $OUT/raw/cuda_graphs-qwen3.log | head -4

# The review mend 08232b0 (knobs::Switch) ran on no GPU before: cuda_ops and gpu_parity again.
(cd $B && timeout 150 ./cuda_ops --test-threads=2 > $OUT/raw/cuda_ops.log 2>&1; echo "cuda_ops rc $?")
grep -E "test result|panicked" $OUT/raw/cuda_ops.log | head -4
(cd $B && timeout 120 ./gpu_parity --test-threads=1 --exact q4_model f16_cache_chunked_prefill bf16_rotating_cache_chunked_prompt qwen3_moe_q4_model longer_prompt_chunked_prefill rotating_cache_whole_prompt rotating_cache_moe greedy_generation_on_device_q4 greedy_generation_on_device_qwen3_moe > $OUT/raw/gpu_parity.log 2>&1; echo "gpu_parity rc $?")
grep -E "test result|panicked" $OUT/raw/gpu_parity.log | head -4
echo done
