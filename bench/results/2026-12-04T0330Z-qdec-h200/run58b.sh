#!/bin/bash
# Device run 58 (prepared in the twenty-ninth session, not run): branch few-row-next against main.
# one = main 52ccbbc's build (kernels as main); next = branch few-row-next: the register kernels'
# addresses advanced per batch (default) and the experimental bf16 form (NUVEC_QIMMA=bf16).
# Carry [".cuda-bin", ".dev", ".gpu-fixtures/core"]. About 10 minutes in all: split it into two
# calls (tests and B = 2-16 first, then the 2 048-position sweep and ncu) if the limit is 600 s.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c && tar -C /tmp/a -xJf .cuda-bin/one.tar.xz && tar -C /tmp/c -xJf .cuda-bin/next.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
[ -f /tmp/m8b/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1
b() { local bin=$1 e=$2 bb=$3; echo "$bin $e B=$bb $(env $e timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for bb in 2 4; do b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; b /tmp/c NUVEC_QIMMA=bf16 $bb; done
# The least keys per split of the tensor-core decode at 2 048 positions (96 now; 160 / 288 were
# +4 % at B = 8 / 16 there in run 56).
g() { local e=$1 bb=$2; echo "$e B=$bb p=2048 $(env $e timeout 60 /tmp/a/nuvec bench --model /tmp/m8b --device cuda -p 2048 -g 32 -b $bb -n 1 2>&1 | grep -E 'Averages|rror' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for bb in 8 16 64; do for kk in 96 128 192 256; do g NUVEC_PAGED_FLASH_MIN_KEYS=$kk $bb; done; done
# Where a B = 8 step goes now (every kernel's duration over one step; launches after the last
# argmax_final_f32 but one).
timeout 200 ncu --clock-control none --cache-control none --print-units base --csv --page raw --metrics gpu__time_duration.sum,launch__grid_size /tmp/c/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 3 -b 8 -n 1 --no-warmup > $OUT/ncu-step-b8.csv 2>/dev/null; xz -9 $OUT/ncu-step-b8.csv
echo done
