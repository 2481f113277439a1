#!/bin/bash
# Session 49, call 4: what holds the warpgroup gate/up now: ncu --set full of one qwg_b4_r64
# launch (a decode step's gate/up, 224 blocks) at B = 64 on 4 of the 8B's layers, the default
# settings; and of the same product on the qdec register kernel (NUVEC_QDEC_WGMMA=0) for the
# comparison of their sections.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-400} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; mkdir -p $B /tmp/fx $WORK $OUT/raw && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 scripts/make-random-checkpoint.py $WORK/m8b4 --shape 8b --layers 4 --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1 || tail -3 /tmp/mk.log
NCU=/usr/local/cuda/bin/ncu
keys='Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued|Stall|stall|L1/TEX Cache Throughput|L2 Cache Throughput|Shared Memory|One or More|No Eligible|Active Warps'
timeout 150 $NCU --set full --kernel-name qwg_b4_r64 --launch-skip 5 -c 1 $B/nuvec bench --model $WORK/m8b4 --device cuda -p 512 -g 4 -b 64 -n 1 > $OUT/raw/ncu-qwg-full.txt 2>&1
echo "== qwg_b4_r64 (left $(left) s)"; grep -E "$keys" $OUT/raw/ncu-qwg-full.txt | head -40
[[ $(left) -gt 100 ]] && { NUVEC_QDEC_WGMMA=0 timeout 120 $NCU --set full --kernel-name qdec_b4_r64_t2 --launch-skip 4 -c 1 $B/nuvec bench --model $WORK/m8b4 --device cuda -p 512 -g 4 -b 64 -n 1 > $OUT/raw/ncu-qdec-full.txt 2>&1
echo "== qdec_b4_r64_t2 (left $(left) s)"; grep -E "$keys" $OUT/raw/ncu-qdec-full.txt | head -40; }
echo "left $(left) s"; echo done
