#!/bin/bash
# Device run 54: the landed ring form (ring2) tested and timed against lg2 (main's register
# pipeline); ncu of a B = 8 decode step: every kernel's duration, and the register kernel's sections.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c && tar -C /tmp/a -xJf .cuda-bin/lg2.tar.xz && tar -C /tmp/c -xJf .cuda-bin/ring2.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/c && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right" | head -30); }
echo "== cuda_bf16"; t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized
echo "== cuda_bf16 QIR_RING=2"; NUVEC_NVRTC_DEFINES=QIR_RING=2 t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
wait
b() { local bin=$1 e=$2 bb=$3; echo "$bin $e B=$bb $(env $e timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for bb in 8 16 2; do b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; done
b /tmp/c NUVEC_CUDA_GRAPHS=0 8
timeout 200 ncu --clock-control none --cache-control none --print-units base --csv --page raw --metrics gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size /tmp/c/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 3 -b 8 -n 1 --no-warmup > $OUT/ncu-step-b8.csv 2>/tmp/ncu1.err; tail -2 /tmp/ncu1.err
timeout 200 ncu --clock-control none --cache-control none --set full -k regex:qimma_b4_r8 --launch-skip 128 -c 4 /tmp/c/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 3 -b 8 -n 1 --no-warmup > $OUT/ncu-r8-full.txt 2>/tmp/ncu2.err; tail -2 /tmp/ncu2.err
xz -9 $OUT/ncu-step-b8.csv
grep -E "qimma_b4_r8|Duration|DRAM Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Issue Slots Busy|No Eligible|Registers Per|Memory Throughput|Warp Cycles Per Issued" $OUT/ncu-r8-full.txt | head -80
echo done
