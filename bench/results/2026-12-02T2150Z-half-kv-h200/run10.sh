#!/bin/bash
# Device run 10 (twenty-first session): half-precision KV caches on CUDA. The GPU suites touching
# caches and attention, then the random 8B decoding with f32 and bf16 (its default now) caches,
# alternated, at B = 1, 8, 32, 64.
cd "$(dirname "$0")/.."
mkdir -p /tmp/k && tar -C /tmp/k -xJf .cuda-bin/kv.tar.xz; B=/tmp/k
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core
t() { local bin=$1 lim=$2; shift 2; (cd $B && timeout $lim ./$bin --test-threads=1 "$@" 2>&1 | grep -E "^test |test result|panicked|left|right|MISMATCH|differ" | head -40); }
t cuda_half_kv 120
t cuda_ops 200 --skip timing_probe
t decode_fusions 120
t cuda_graph 120
t gpu_parity 400
t gpu_batch 300
t cuda_graphs 200
(cd $B && NUVEC_GPU_FIXTURES=$OLDPWD/.gpu-fixtures/bf16 timeout 200 ./gpu_parity_bf16 --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | head -20)
wait
run() { local b=$1 kv=$2; echo "B=$b kv=$kv $($B/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 --kv-dtype $kv 2>&1 | grep -E 'Averages|rror' | tail -1)"; }
for round in 1 2; do for b in 1 8 32 64; do run $b f32; run $b bf16; done; done
echo done
