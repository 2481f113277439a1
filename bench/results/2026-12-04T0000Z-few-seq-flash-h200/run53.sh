#!/bin/bash
# Device run 53: the register kernels (2-16 rows) with each warp's weights, scales and biases
# through a cp.async ring (QIR_RING slots, QIR_MT tiles of 16 rows per warp) against main's
# (lg2: same qimma.cu as main f181b8a).
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c && tar -C /tmp/a -xJf .cuda-bin/lg2.tar.xz && tar -C /tmp/c -xJf .cuda-bin/ring.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/c && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right" | head -30); }
echo "== cuda_bf16 default"; t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized
echo "== cuda_bf16 QIR_MT=2"; NUVEC_NVRTC_DEFINES=QIR_MT=2 t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
wait
b() { local bin=$1 e=$2 bb=$3; echo "$bin $e B=$bb $(env $e timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
D=NUVEC_NVRTC_DEFINES
for r in 1 2; do for bb in 8 16; do b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; b /tmp/c $D=QIR_MT=2 $bb; done; done
for bb in 8 16; do b /tmp/c $D=QIR_RING=3 $bb; b /tmp/c $D=QIR_RING=6 $bb; b /tmp/c $D=QIR_RING=0 $bb; done
for bb in 2 4; do b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; done
echo done
