#!/bin/bash
# Device run 12: gpt-oss (sinks) and Gemma 4 (own rotating caches, KV-shared layers) with bf16
# caches against the CPU; the random 8B decoding 64 sequences of 3,072 positions with f32 and bf16
# caches; the kernel times of B = 64 decode steps.
cd "$(dirname "$0")/.."
mkdir -p /tmp/k && tar -C /tmp/k -xJf .cuda-bin/kv.tar.xz; B=/tmp/k
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/a
(cd $B && timeout 200 ./gpu_parity --test-threads=1 --nocapture gpt_oss_bf16_cache gemma4_bf16_cache gemma4_q4_model gpt_oss_q4_model gpt_oss_chunked 2>&1 | grep -E "^test |test result|panicked|RESULT|moves|difference" | head -40)
wait
for kv in f32 bf16; do echo "B=64 p=3072 kv=$kv $($B/nuvec bench --model /tmp/m8b --device cuda -p 3072 -g 32 -b 64 -n 1 --no-warmup --kv-dtype $kv 2>&1 | grep -E 'Averages|rror' | tail -1)"; done
timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv -f \
  $B/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 3 -b 64 -n 1 --no-warmup > $OUT/ncu64.csv 2>$OUT/ncu64.err
echo "ncu64 rc=$?"
echo done
