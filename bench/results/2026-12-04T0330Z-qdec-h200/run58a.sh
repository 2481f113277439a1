#!/bin/bash
# Device run 58 (prepared in the twenty-ninth session, not run): branch few-row-next against main.
# one = main 52ccbbc's build (kernels as main); next = branch few-row-next: the register kernels'
# addresses advanced per batch (default) and the experimental bf16 form (NUVEC_QIMMA=bf16).
# Carry [".cuda-bin", ".dev", ".gpu-fixtures/core"]. About 10 minutes in all: split it into two
# calls (tests and B = 2-16 first, then the 2 048-position sweep and ncu) if the limit is 600 s.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c && tar -C /tmp/a -xJf .cuda-bin/one.tar.xz && tar -C /tmp/c -xJf .cuda-bin/next.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/c && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right" | head -30); }
echo "== cuda_bf16 (default)"; t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized
echo "== gpu_batch (default)"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
echo "== gpu_batch NUVEC_QIMMA=bf16"; NUVEC_QIMMA=bf16 NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
wait
b() { local bin=$1 e=$2 bb=$3; echo "$bin $e B=$bb $(env $e timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for r in 1 2; do for bb in 8 16; do b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; b /tmp/c NUVEC_QIMMA=bf16 $bb; done; done
echo done
