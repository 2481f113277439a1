#!/bin/bash
# Device run 64: producers write the bf16 register products' input (norm, paged merge, silu*up);
# tests, then main (a) vs new (c) alternated at B = 1-64.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c && tar -C /tmp/a -xJf .cuda-bin/base.tar.xz && tar -C /tmp/c -xJf .cuda-bin/new.tar.xz
G=$PWD/.gpu-fixtures/core; T=$G/mistral-q4g64
([ -f /tmp/m8b/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer $T >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
python3 scripts/make-random-checkpoint.py $G/random-tiny-q4 --shape tiny --tokenizer $T >/dev/null 2>&1 || echo "make tiny failed"
t() { local s=$1; shift; (cd /tmp/c && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|error|RESULT|differ" | head -40); }
echo "== cuda_bf16"; t 240 ./cuda_bf16 --test-threads=1 --nocapture products_over batched_decode linear_many linear_quantized paged_decode
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$G t 200 ./gpu_batch --test-threads=1 --nocapture
wait
b() { local bin=$1 bb=$2; echo "$bin B=$bb $(timeout 90 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for bb in 8 32 64 1 16 48; do b /tmp/a $bb; b /tmp/c $bb; done
for bb in 8 32 64; do b /tmp/c $bb; b /tmp/a $bb; done
echo done
