#!/bin/bash
# Device run 79: why the Batcher prefills at ~17k tok/s: nuvec bench prefill of 8 x 1024 against
# 1 x 8192 and 1 x 1024 (timing), then ncu kernel tables of the first two.
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/n && tar -C /tmp/n -xJf .cuda-bin/px2.tar.xz
G=$PWD/.gpu-fixtures/core; T=$G/mistral-q4g64
[ -f /tmp/m8b/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer $T >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }
b() { echo "$* :: $(timeout 120 /tmp/n/nuvec bench --model /tmp/m8b --device cuda "$@" 2>&1 | grep -E 'Averages|rror|panick' | tr '\n' ' ')"; }
for r in 1 2; do b -p 1024 -g 2 -b 8 -n 2; b -p 8192 -g 2 -b 1 -n 2; b -p 1024 -g 2 -b 1 -n 2; b -p 5120 -g 2 -b 1 -n 2; done
n() { timeout 240 ncu --clock-control none --cache-control none --print-units base --csv --page raw --metrics gpu__time_duration.sum,launch__grid_size /tmp/n/nuvec bench --model /tmp/m8b --device cuda "$@" -g 1 -n 1 --no-warmup > $OUT/ncu-$1$2-$5$6.csv 2>/dev/null; xz -9 $OUT/ncu-$1$2-$5$6.csv; }
n -p 1024 -b 8; n -p 8192 -b 1
ls -la $OUT
echo done
