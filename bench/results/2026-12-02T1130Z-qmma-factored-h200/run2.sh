#!/bin/bash
# Device run 2: why the few-row products run at 0.5 TB/s: ncu sections on the qmma kernels of a
# B=8 and a B=32 step (old kernel and factored one).
cd "$(dirname "$0")/.."
B=.cuda-bin
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed"
prof() { local bin=$1 b=$2 tag=$3; timeout 170 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis -k regex:qmma_b --launch-skip 21 --launch-count 7 \
  $B/$bin bench --model /tmp/m8b --device cuda -p 16 -g 3 -b $b -n 1 --no-warmup > $OUT/sec_$tag.txt 2>$OUT/sec_$tag.err; echo "$tag rc=$?"; }
prof nuvec 8 new8
prof nuvec-old 8 old8
prof nuvec 32 new32
echo done
