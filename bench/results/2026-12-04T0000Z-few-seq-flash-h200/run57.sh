#!/bin/bash
# Device run 57: the register kernels' body inlined once per scale type (the weight picked first)
# against three inlined bodies (base = 4b1ef9d's nuvec), B = 8 and 16; the new build's tests.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c && tar -C /tmp/a -xJf .cuda-bin/base-nuvec.tar.xz && tar -C /tmp/c -xJf .cuda-bin/one.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/c && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right" | head -30); }
echo "== cuda_bf16"; t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
wait
b() { local bin=$1 bb=$2; echo "$bin B=$bb $(timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for r in 1 2; do for bb in 8 16; do b /tmp/a $bb; b /tmp/c $bb; done; done
echo done
