#!/bin/bash
# Device run 31: qimma with a block-shared cp.async pipeline (weights and x's parts in shared
# memory). Tests, then the random 8B at B = 1..64: integer kernels off / on / on with the 32-row
# form uncapped (QI_X32_MIN_BLOCKS=1), alternated.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q2.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|error|gpu .* vs" | head -40); }
t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_quantized linear_many
NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/bf16 t 200 ./gpu_parity_bf16 --test-threads=1 q4_batched_decode
NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 200 ./gpu_batch --test-threads=1
wait
for r in 1 2; do for b in 2 8 16 32 64; do for q in 0 1 x; do
  env=""; [ $q = x ] && env="NUVEC_NVRTC_DEFINES=QI_X32_MIN_BLOCKS=1"; [ $q = x ] && [ $b -lt 17 ] && continue
  echo "r$r B=$b qimma=$q $(env NUVEC_QIMMA=${q/x/1} $env timeout 60 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E 'Averages|rror|panick' | tr '\n' ' ')"
done; done; done
echo done
