#!/bin/bash
# Device run 60: B = 2 / 4 one vs dec; where a B = 8 and a B = 64 step go with the bf16 register
# kernels at 2-64 rows (ncu, every kernel's duration and grid).
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c && tar -C /tmp/a -xJf .cuda-bin/one.tar.xz && tar -C /tmp/c -xJf .cuda-bin/dec.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
[ -f /tmp/m8b/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1
b() { local bin=$1 e=$2 bb=$3; echo "$bin $e B=$bb $(env $e timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for bb in 2 4; do b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; done
b /tmp/c NUVEC_QDEC_ROWS=32 64; b /tmp/c NUVEC_QDEC_ROWS=64 64
for bb in 8 64; do
NUVEC_QDEC_ROWS=64 timeout 200 ncu --clock-control none --cache-control none --print-units base --csv --page raw --metrics gpu__time_duration.sum,launch__grid_size /tmp/c/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 3 -b $bb -n 1 --no-warmup > $OUT/ncu-step-b$bb.csv 2>/dev/null; xz -9 $OUT/ncu-step-b$bb.csv
done
echo done
