#!/bin/bash
# Session 48, call 7: what holds the batched decode's gate/up product (qdec_b4_r64_t2, 111 us at
# B = 64 under call 4's ncu) and the one-tile form (qdec_b4_r64): one launch each under
# `ncu --set full` (speed of light, memory, warp stall reasons), the 8B shape at 4 layers, B = 64.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-300} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; mkdir -p $B /tmp/fx $WORK $OUT && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 scripts/make-random-checkpoint.py $WORK/m8b4 --shape 8b --layers 4 --seed 0 --tokenizer /tmp/fx/mistral-q4g64 | tail -1
timeout 60 $B/nuvec bench --model $WORK/m8b4 --device cuda -p 512 -g 8 -b 64 -n 1 2>&1 | grep -oE 'generation_tps=[0-9.]*' | head -1
for k in qdec_b4_r64_t2 qdec_b4_r64; do
  [[ $(left) -lt 60 ]] && break
  timeout 150 /usr/local/cuda/bin/ncu --set full --kernel-name $k --launch-skip 4 -c 1 $B/nuvec bench --model $WORK/m8b4 --device cuda -p 512 -g 8 -b 64 -n 1 > $OUT/ncu-full-$k.txt 2>&1
  echo "== $k (left $(left) s)"
  grep -E "^\s+(Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit Rate|L2 Hit Rate|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Limit|Issue Slots Busy|Executed Ipc Active|L1/TEX Cache Throughput|L2 Cache Throughput|Warp Cycles Per Issued Instruction|Avg. Active Threads Per Warp|Grid Size|Waves Per SM|Dynamic Shared Memory Per Block)" $OUT/ncu-full-$k.txt
  grep -E "(OPT|WRN)" -A2 $OUT/ncu-full-$k.txt | cut -c1-400 | head -40
done
echo "left $(left) s"; echo done
