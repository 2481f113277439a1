#!/bin/bash
# Device run 51: the final build (group size 64 compiled in, loader found once, two pipeline
# slots with the scales stored before the barrier) against main 3ef8f7b.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c && tar -C /tmp/a -xJf .cuda-bin/main.tar.xz && tar -C /tmp/c -xJf .cuda-bin/lg2.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
(python3 scripts/make-random-checkpoint.py /tmp/a3b --shape a3b --layers 12 --vocab 32000 --tokenizer .dev/tok >/tmp/mk2.log 2>&1 || { echo "make a3b failed"; tail -5 /tmp/mk2.log; }) &
t() { local s=$1; shift; (cd /tmp/c && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right" | head -30); }
echo "== cuda_bf16"; t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized
echo "== cuda_moe_grouped"; t 120 ./cuda_moe_grouped --test-threads=1
echo "== cuda_moe"; t 120 ./cuda_moe --test-threads=1
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
wait
b() { local bin=$1 e=$2 bb=$3; echo "$bin $e B=$bb $(env $e timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//' | tr '\n' ' ')"; }
for r in 1 2; do for bb in 64 32; do b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; b /tmp/c NUVEC_NVRTC_DEFINES=QM_STAGES=3 $bb; done; done
for bb in 48 24; do b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; done
for bb in 32 24; do b /tmp/c NUVEC_NVRTC_DEFINES=QM_DEQ_FROM=17 $bb; done
p() { local bin=$1 e=$2; echo "$bin $e a3b prefill $(env $e timeout 60 $bin/nuvec bench --model /tmp/a3b --device cuda -p 4096 -g 8 -b 1 -n 2 2>&1 | grep -E 'Averages|rror|panick' | tr '\n' ' ')"; }
for r in 1 2; do p /tmp/a X=0; p /tmp/c X=0; p /tmp/c NUVEC_NVRTC_DEFINES=QM_STAGES=3; done
echo done
