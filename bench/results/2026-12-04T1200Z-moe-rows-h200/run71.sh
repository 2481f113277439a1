#!/bin/bash
# Device run 71: where a mixture-of-experts decode step's time goes (issue 32). Random 12-layer
# Qwen3-30B-A3B and gpt-oss-20b shapes made here; decode at B = 1 (graphs on and off), batches;
# ncu kernel tables of a B = 1 step of each.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && tar -C /tmp/n -xJf .cuda-bin/moe.tar.xz
python3 scripts/make-random-checkpoint.py /tmp/a3b --shape a3b --layers 12 --tokenizer .gpu-fixtures/core/mistral-q4g64 >/tmp/mk1.log 2>&1 &
python3 scripts/make-random-checkpoint.py /tmp/oss --shape gpt-oss-20b --layers 12 --tokenizer .gpu-fixtures/core/mistral-q4g64 >/tmp/mk2.log 2>&1 &
wait; tail -1 /tmp/mk1.log /tmp/mk2.log
b() { local m=$1; shift; echo "$m $* :: $(timeout 120 /tmp/n/nuvec bench --model /tmp/$m --device cuda "$@" 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for r in 1 2; do
  b a3b -p 512 -g 128 -n 1; b oss -p 512 -g 128 -n 1
done
NUVEC_CUDA_GRAPHS=0 b a3b -p 512 -g 128 -n 1
for m in a3b oss; do b $m -p 128 -g 32 -b 8 -n 1; b $m -p 128 -g 32 -b 64 -n 1; done
for m in a3b oss; do
timeout 200 ncu --clock-control none --cache-control none --print-units base --csv --page raw --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size /tmp/n/nuvec bench --model /tmp/$m --device cuda -p 16 -g 3 -n 1 --no-warmup > $OUT/ncu-$m-b1.csv 2>/dev/null; xz -9 $OUT/ncu-$m-b1.csv
done
NUVEC_CUDA_GRAPHS=0 timeout 200 nsys profile -o $OUT/oss-b1 --stats=false /tmp/n/nuvec bench --model /tmp/oss --device cuda -p 16 -g 16 -n 1 --no-warmup >/dev/null 2>&1 && (cd $OUT && nsys stats -r cuda_api_sum,cuda_gpu_kern_sum oss-b1.nsys-rep 2>/dev/null | head -70 > oss-b1-stats.txt; rm -f oss-b1.nsys-rep oss-b1.sqlite)
echo done
