#!/bin/bash
# Device run 49: where qmma_b4_d64's time goes at 64 rows (ncu full sections over one decode layer's
# seven products), and occupancy/pipeline knobs at B = 64 without a rebuild.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a && tar -C /tmp/a -xJf .cuda-bin/main.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }
timeout 200 ncu --clock-control none --cache-control none --set full --import-source no -k regex:qmma_b4_d64 --launch-skip 1 -c 7 /tmp/a/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 2 -b 64 -n 1 --no-warmup > $OUT/ncu-d64-full.txt 2>&1
echo "ncu rc=$?"; grep -E "qmma_b4_d64|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Block Limit|Memory Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Eligible Warps|Active Warps Per" $OUT/ncu-d64-full.txt | head -80
b() { echo "$1 B=$2 $(env $1 timeout 60 /tmp/a/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $2 -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//' | tr '\n' ' ')"; }
for r in 1 2; do for e in X=0 NUVEC_NVRTC_DEFINES=QM_STAGES=2 NUVEC_NVRTC_DEFINES=QM_STAGES=2,QM_DEQ_MIN_BLOCKS=3 NUVEC_NVRTC_DEFINES=QM_STAGES=4; do b $e 64; done; done
b NUVEC_QIMMA=1 64; b NUVEC_QIMMA=1 32; b X=0 32
xz -9 $OUT/ncu-d64-full.txt
echo done
