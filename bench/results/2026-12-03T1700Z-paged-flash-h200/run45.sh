#!/bin/bash
# Device run 45: paged decode of many sequences on the tensor cores (paged_flash_decode_bf16_d*).
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q13.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|RESULT paged" | head -24); }
echo "== cuda_bf16"; t 150 ./cuda_bf16 --test-threads=1 --nocapture paged_decode batched_decode
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
wait
b() { local env=$1 bb=$2 p=$3 g=$4; echo "$env B=$bb p=$p $(env $env timeout 60 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p $p -g $g -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//' | tr '\n' ' ')"; }
for r in 1 2; do for e in NUVEC_PAGED_FLASH=1 NUVEC_PAGED_FLASH=0 NUVEC_ATTS_BATCH_BLOCKS=4096 NUVEC_ATTS_BATCH_BLOCKS=1024; do b $e 64 512 64; done; done
for e in NUVEC_PAGED_FLASH=1 NUVEC_PAGED_FLASH=0; do b $e 32 512 64; done
for e in NUVEC_PAGED_FLASH=1 NUVEC_PAGED_FLASH=0; do b $e 64 2048 32; done
for e in NUVEC_PAGED_FLASH=1 NUVEC_PAGED_FLASH=0; do b $e 16 512 64; done
timeout 90 ncu --clock-control none --print-units base --csv --metrics gpu__time_duration.sum -k regex:'paged_|attention_merge' -c 64 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 3 -b 64 -n 1 --no-warmup > $OUT/ncu-flash.csv 2>/dev/null
echo "ncu rc=$?"
echo done
