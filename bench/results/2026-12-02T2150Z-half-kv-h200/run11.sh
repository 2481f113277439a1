#!/bin/bash
# Device run 11: the half-cache parity cases with their rounding-aware tolerance, gpu_parity_bf16
# (its mistral-bf16 weights copied in), the kernel times of decode steps at B = 64, and issue 24's
# workload at 64 concurrent with f32 and bf16 caches.
cd "$(dirname "$0")/.."
mkdir -p /tmp/k && tar -C /tmp/k -xJf .cuda-bin/kv.tar.xz; B=/tmp/k
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
cp .gpu-fixtures/core/mistral-bf16/*.safetensors .gpu-fixtures/bf16/mistral-bf16/
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core
(cd $B && timeout 300 ./gpu_parity --test-threads=1 --nocapture bf16_model_bf16_cache f16_cache_chunked_prefill bf16_rotating_cache_chunked_prompt 2>&1 | grep -E "^test |test result|panicked|RESULT|moves|difference" | head -40)
(cd $B && NUVEC_GPU_FIXTURES=$OLDPWD/.gpu-fixtures/bf16 timeout 200 ./gpu_parity_bf16 --test-threads=1 2>&1 | grep -E "^test |test result|panicked|differ" | head -20)
wait
timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv -f \
  $B/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 4 -b 64 -n 1 --no-warmup > $OUT/ncu64.csv 2>$OUT/ncu64.err
echo "ncu64 rc=$?"
for kv in bf16 f32; do
  echo "kv=$kv"; timeout 200 python3 bench/compare_serve_workload.py --model /tmp/m8b --nuvec $B/nuvec --python python3 --vocab 32000 \
    --device cuda --concurrency 64 --rate 0 --rounds 1 --skip-mlx --kv-dtype $kv 2>&1 | grep -E "^C=" | head -4
done
echo done
