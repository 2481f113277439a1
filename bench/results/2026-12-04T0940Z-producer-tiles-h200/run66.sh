#!/bin/bash
# Device run 66: the final build (producers' tiles; bf16 products only where the matmul precision
# allows; gpu_batch teacher-forced). GPU tests; main (a) vs final (n) alternated; ncu B = 8 / 64.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/n && tar -C /tmp/a -xJf .cuda-bin/base.tar.xz && tar -C /tmp/n -xJf .cuda-bin/fin.tar.xz
G=$PWD/.gpu-fixtures/core; T=$G/mistral-q4g64
([ -f /tmp/m8b/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer $T >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
python3 scripts/make-random-checkpoint.py $G/random-tiny-q4 --shape tiny --tokenizer $T >/dev/null 2>&1 || echo "make tiny failed"
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|error|differ|gpu_batch random|allowed" | head -40); }
echo "== cuda_ops"; t 200 ./cuda_ops --test-threads=1
echo "== cuda_auto_precision"; t 200 ./cuda_auto_precision --test-threads=1
echo "== cuda_bf16"; t 300 ./cuda_bf16 --test-threads=1
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$G t 200 ./gpu_batch --test-threads=1 --nocapture
wait
b() { local bin=$1 bb=$2; echo "$bin B=$bb $(timeout 90 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for bb in 8 32 64 2 4 24; do b /tmp/a $bb; b /tmp/n $bb; done
for bb in 8 32 64; do b /tmp/n $bb; b /tmp/a $bb; done
for bb in 8 64; do
timeout 200 ncu --clock-control none --cache-control none --print-units base --csv --page raw --metrics gpu__time_duration.sum,launch__grid_size /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 3 -b $bb -n 1 --no-warmup > $OUT/ncu-step-b$bb.csv 2>/dev/null; xz -9 $OUT/ncu-step-b$bb.csv
done
echo done
