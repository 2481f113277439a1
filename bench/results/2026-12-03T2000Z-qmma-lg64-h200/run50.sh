#!/bin/bash
# Device run 50: qmma's bodies with the group size 64 compiled in and a loader found once per
# block (branch work) against main 3ef8f7b.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c && tar -C /tmp/a -xJf .cuda-bin/main.tar.xz && tar -C /tmp/c -xJf .cuda-bin/lg.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/c && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right" | head -30); }
echo "== cuda_bf16"; t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized
echo "== cuda_moe_grouped"; t 120 ./cuda_moe_grouped --test-threads=1
echo "== cuda_moe"; t 120 ./cuda_moe --test-threads=1
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
wait
b() { local bin=$1 e=$2 bb=$3; echo "$bin $e B=$bb $(env $e timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//' | tr '\n' ' ')"; }
for r in 1 2; do for bb in 64 32; do b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; b /tmp/c NUVEC_NVRTC_DEFINES=QM_STAGES=2 $bb; done; done
for bb in 48 24 16; do b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; done
b /tmp/c NUVEC_NVRTC_DEFINES=QM_STAGES=2,QM_DEQ_MIN_BLOCKS=3 64
timeout 100 ncu --clock-control none --cache-control none --print-units base --csv --metrics gpu__time_duration.sum,sm__inst_executed.sum -k regex:qmma_b4_d64 --launch-skip 1 -c 7 /tmp/c/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 2 -b 64 -n 1 --no-warmup 2>/dev/null | grep qmma | cut -d, -f5,9,13- 
echo done
