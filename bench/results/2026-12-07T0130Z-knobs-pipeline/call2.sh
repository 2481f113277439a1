#!/bin/bash
# Session 53, call 2: call 1's binaries (bb68deb + the read_later patch, as landed in 65b7483 but
# for knobs.rs's parse refactor 899d465) over every gpu_batch case: the fixtures call 1 lacked are
# carried (qwen3-q4g64, moe_bf16/qwen3_moe-bf16q4) or made here (random-tiny-q4, random-small-q4,
# scripts/make-random-checkpoint.py), so the batched paths the per-device knobs pick (bf16 register
# kernels, warpgroup kernels, grouped MoE, tensor-core paged decode, shared prefixes) run against
# each sequence alone; then cuda_graphs' qwen3 case.
cd "$(dirname "$0")/../../.."
B=/tmp/b; G=/tmp/gfx; mkdir -p $B /tmp/fx $G $OUT/raw
tar -C $B -xJf .gpu-run/bins9.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz && tar -C $G -xJf .gpu-run/gfx.tar.xz && tar -C $G -xJf .gpu-run/q3.tar.xz
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
echo done
