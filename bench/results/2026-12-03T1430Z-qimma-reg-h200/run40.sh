#!/bin/bash
# Device run 40: ncu sections of qimma_b4_r8 (B=2, 8) and qmma_b4_f32 (B=8).
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q8.tar.xz
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis"
f() { grep -E "^  [a-z_0-9]+\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Stall|Warp Cycles Per Issued|Issued Warp|Block Limit|Grid Size|Mem Busy|Max Bandwidth|Waves" | grep -v "^ *$" | head -60; }
echo "== r8 B=8"; timeout 120 ncu $S -k regex:qimma_b4_r8 -s 2 -c 2 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 4 -g 3 -b 8 -n 1 --no-warmup 2>&1 | f
echo "== qmma B=8"; NUVEC_QIMMA=0 timeout 120 ncu $S -k regex:qmma_b4_f32 -s 2 -c 1 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 4 -g 3 -b 8 -n 1 --no-warmup 2>&1 | f
echo done
