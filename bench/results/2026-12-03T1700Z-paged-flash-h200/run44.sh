#!/bin/bash
# Device run 44: v3 register kernels + paged decode with one chunk of keys for many sequences.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q12.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|RESULT paged" | head -24); }
echo "== cuda_ops paged"; t 100 ./cuda_ops --test-threads=1 paged_decode
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
echo "== cuda_bf16"; t 150 ./cuda_bf16 --test-threads=1 batched_decode linear_quantized
wait
b() { local blocks=$1 bb=$2 p=$3 g=$4; echo "blocks=$blocks B=$bb p=$p $(NUVEC_ATTS_BATCH_BLOCKS=$blocks timeout 60 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p $p -g $g -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//' | tr '\n' ' ')"; }
for r in 1 2; do for x in 0 1024 2048 4096; do b $x 64 512 64; done; done
for x in 0 2048 1024; do b $x 32 512 64; done
for x in 0 2048; do b $x 64 2048 32; done
for x in 0 2048; do
  NUVEC_ATTS_BATCH_BLOCKS=$x timeout 90 ncu --clock-control none --print-units base --csv --metrics gpu__time_duration.sum -k regex:'paged_attention|attention_merge' -c 64 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 3 -b 64 -n 1 --no-warmup > $OUT/ncu-att-$x.csv 2>/dev/null
  echo "ncu blocks=$x rc=$?"; python3 .dev/agg.py $OUT/ncu-att-$x.csv 1 2>&1 | head -6
done
echo done
