#!/bin/bash
# Device run 61: the bf16 register kernels at 2-64 rows by default; 2 / 4 weight tiles per block
# (NUVEC_QDEC_TPB) at 32 and 64 rows.
cd "$(dirname "$0")/.."
mkdir -p /tmp/c && tar -C /tmp/c -xJf .cuda-bin/wide.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
([ -f /tmp/m8b/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/c && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|error" | head -30); }
echo "== cuda_bf16 (default)"; t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized
echo "== gpu_batch (default)"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
echo "== gpu_batch NUVEC_QDEC_TPB=4"; NUVEC_QDEC_TPB=4 NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
wait
b() { local bin=$1 e=$2 bb=$3; echo "$bin $e B=$bb $(env $e timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for r in 1 2; do for bb in 64 32; do for tp in 1 2 4; do b /tmp/c NUVEC_QDEC_TPB=$tp $bb; done; done; done
b /tmp/c X=0 8
echo done
