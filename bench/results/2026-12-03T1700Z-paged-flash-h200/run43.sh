#!/bin/bash
# Device run 43: main (51418a4) GPU tests; register kernels v3 (scales a batch ahead) vs main at
# B = 8, 16; ncu kernel times of B = 64 decode steps at 512 positions.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q11.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right" | head -24); }
echo "== cuda_bf16"; t 150 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 150 ./gpu_batch --test-threads=1
wait
echo "== v3 cuda_bf16 needs the v3 source: skipped (host unchanged); bench A/B"
for r in 1 2; do for b in 8 16; do for v in nuvec nuvec-v3; do
  echo "r$r B=$b $v $(timeout 60 /tmp/n/$v bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $b -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//' | tr '\n' ' ')"
done; done; done
echo "B=64 $(timeout 60 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b 64 -n 1 2>&1 | grep -E 'Averages|rror|panick' | tr '\n' ' ')"
timeout 240 ncu --clock-control none --print-units base --csv --metrics gpu__time_duration.sum /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 3 -b 64 -n 1 --no-warmup --prefill-step-size 32768 > $OUT/ncu64.csv 2>$OUT/ncu64.err
echo "ncu rc=$?"; tail -3 $OUT/ncu64.err
python3 .dev/agg.py $OUT/ncu64.csv 3 2>&1 | head -40
echo done
