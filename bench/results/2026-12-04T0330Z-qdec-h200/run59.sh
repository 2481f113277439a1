#!/bin/bash
# Device run 59: the bf16 register kernels (qdec) as the default for 2-16 rows; qdec_b4_r32/_r64
# (NUVEC_QDEC_ROWS) against the qmma kernels at 17-64 rows. one = main 52ccbbc's kernels.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c && tar -C /tmp/a -xJf .cuda-bin/one.tar.xz && tar -C /tmp/c -xJf .cuda-bin/dec.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
([ -f /tmp/m8b/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/c && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|error" | head -30); }
echo "== cuda_bf16 (default)"; t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized
echo "== cuda_bf16 NUVEC_QDEC_ROWS=64"; NUVEC_QDEC_ROWS=64 t 100 ./cuda_bf16 --test-threads=1 batched_decode linear_many
echo "== cuda_bf16 NUVEC_QIMMA=int"; NUVEC_QIMMA=int t 100 ./cuda_bf16 --test-threads=1 batched_decode linear_many
echo "== gpu_batch (default)"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
echo "== gpu_batch NUVEC_QDEC_ROWS=64"; NUVEC_QDEC_ROWS=64 NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
wait
b() { local bin=$1 e=$2 bb=$3; echo "$bin $e B=$bb $(env $e timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for bb in 8 16; do b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; done
for r in 1 2; do for bb in 24 32 48 64; do b /tmp/c X=0 $bb; b /tmp/c NUVEC_QDEC_ROWS=64 $bb; done; done
echo done
