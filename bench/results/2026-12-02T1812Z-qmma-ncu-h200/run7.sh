#!/bin/bash
# Device run (twentieth session): qmma's registers and spills (nvcc -Xptxas -v on common.cuh +
# qmma.cu, as NVRTC compiles them), then ncu's launch, occupancy, scheduler and warp-state
# sections for the qmma kernels of a B=8 and a B=32 decode step (random 8B, 6d406ca's nuvec:
# the CUDA code has not changed since).
cd "$(dirname "$0")/.."
mkdir -p /tmp/b && tar -C /tmp/b -xJf .cuda-bin/bins.tar.xz; B=/tmp/b
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
K=crates/nuvec/src/backends/cuda/kernels
cat $K/common.cuh $K/qmma.cu > /tmp/qmma_all.cu
nvcc --version | tail -1
nvcc -arch=sm_90 -std=c++17 -Xptxas -v -c /tmp/qmma_all.cu -o /tmp/qmma.o > $OUT/ptxas.txt 2>&1
grep -E "Compiling entry|registers|spill|error" $OUT/ptxas.txt | head -40
wait
S="--section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"
timeout 200 ncu $S -k regex:qmma_b4 -c 6 $B/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 3 -b 8 -n 1 --no-warmup > $OUT/ncu-b8.txt 2>&1
grep -E "qmma_b4|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Eligible Warps|Issued Warp|No Eligible|Active Warps Per|Warp Cycles Per Issued|Duration|Memory Throughput|Compute \(SM\)" $OUT/ncu-b8.txt | head -60
timeout 200 ncu $S -k regex:qmma_b4 -c 6 $B/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 3 -b 32 -n 1 --no-warmup > $OUT/ncu-b32.txt 2>&1
grep -E "qmma_b4|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Eligible Warps|No Eligible|Warp Cycles Per Issued|Duration" $OUT/ncu-b32.txt | head -40
echo done
