#!/bin/bash
# Device run 1 (nineteenth session): the GPU suites at 6d406ca (gpu_parity not run on the GPU since
# eaddf65), then the batched bench on the random 8B.
cd "$(dirname "$0")/.."
mkdir -p /tmp/b && tar -C /tmp/b -xJf .cuda-bin/bins.tar.xz; B=/tmp/b
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core
(cd $B && timeout 300 ./gpu_parity --test-threads=1 f32_model q4_model q8_model bf16_model qwen3_moe_q4_model longer_prompt_chunked_prefill rotating_cache_whole_prompt rotating_cache_chunked_prompt rotating_cache_moe greedy_generation_on_device 2>&1 | grep -E "^test |test result|panicked|left|right" | head -40)
(cd $B && timeout 200 ./gpu_batch --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right" | head -20)
(cd $B && timeout 150 ./cuda_bf16 --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | head -30)
(cd $B && NUVEC_GPU_FIXTURES=$OLDPWD/.gpu-fixtures/bf16 timeout 150 ./gpu_parity_bf16 --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | head -20)
wait
for b in 1 8 16 32 64; do echo "B=$b $($B/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E 'Averages|rror' | tail -1)"; done
for b in 8 16; do echo "B=$b $($B/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E 'Averages|rror' | tail -1)"; done
echo done
