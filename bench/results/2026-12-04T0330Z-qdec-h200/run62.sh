#!/bin/bash
# Device run 62: the final build (qdec at 2-64 rows, two tiles a block where they fill the GPU)
# against main 52ccbbc's kernels (one), tests and B = 1-64.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c && tar -C /tmp/a -xJf .cuda-bin/one.tar.xz && tar -C /tmp/c -xJf .cuda-bin/final.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
([ -f /tmp/m8b/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/c && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|error" | head -30); }
echo "== cuda_bf16"; t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
wait
b() { local bin=$1 e=$2 bb=$3; echo "$bin $e B=$bb $(env $e timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for bb in 1 8 32 64; do b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; done
b /tmp/c NUVEC_QDEC_TPB=1 64; b /tmp/c X=0 64
echo done
