#!/bin/bash
# Device run 56: the tensor-core paged decode for every step of 2+ sequences over a bf16 store,
# with at least NUVEC_PAGED_FLASH_MIN_KEYS keys per split (default 96). The old behaviour in the
# same binary: NUVEC_PAGED_FLASH=0 at B <= 16 (solo splits, f32 kernel), MIN_KEYS=32 at B >= 32.
cd "$(dirname "$0")/.."
mkdir -p /tmp/c && tar -C /tmp/c -xJf .cuda-bin/flash.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/c && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right" | head -30); }
echo "== cuda_ops paged"; t 150 ./cuda_ops --test-threads=1 paged rope_and_paged
echo "== cuda_half_kv"; t 100 ./cuda_half_kv --test-threads=1
echo "== cuda_bf16 paged"; t 100 ./cuda_bf16 --test-threads=1 paged
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
wait
b() { local e=$1 bb=$2 p=${3:-512} g=${4:-64}; echo "$e B=$bb p=$p $(env $e timeout 60 /tmp/c/nuvec bench --model /tmp/m8b --device cuda -p $p -g $g -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
K=NUVEC_PAGED_FLASH_MIN_KEYS
b X=0 2
for bb in 2 4 8 16; do b NUVEC_PAGED_FLASH=0 $bb; b X=0 $bb; b $K=160 $bb; done
for bb in 32 64; do b $K=32 $bb; b X=0 $bb; b $K=160 $bb; b $K=288 $bb; done
for bb in 8 16; do b NUVEC_PAGED_FLASH=0 $bb 2048 32; b X=0 $bb 2048 32; b $K=160 $bb 2048 32; b $K=288 $bb 2048 32; done
for bb in 8 64; do b X=0 $bb; b NUVEC_PAGED_FLASH=0 $bb; done
echo done
