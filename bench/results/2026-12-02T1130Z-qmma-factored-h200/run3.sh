#!/bin/bash
# Device run 3: qmma factored + cp.async pipeline (3 slots). Correctness, old/new alternated on the
# random 8B, ncu kernel times at B=8 and the stall sections of one layer's products at B=8.
cd "$(dirname "$0")/.."
B=.cuda-bin
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed"
(cd $B && timeout 200 ./cuda_bf16 --test-threads=1 --nocapture batched_decode linear_quantized linear_many 2>&1 | grep -E "^test |test result|panicked|k=4096 n=1000 m=(2|9|17) " | head -30)
run() { local bin=$1 b=$2 tag=$3; shift 3; r=$(env "$@" $B/$bin bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E "Averages|rror" | tail -1); echo "$tag B=$b $r"; }
for round in 1 2; do
  for b in 8 32; do
    run nuvec-old $b old X=1
    run nuvec $b new X=1
  done
done
for b in 2 4 16; do run nuvec-old $b old X=1; run nuvec $b new X=1; done
run nuvec 1 new X=1
run nuvec 64 new X=1
timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv -f \
  $B/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 4 -b 8 -n 1 --no-warmup > $OUT/ncu8.csv 2>$OUT/ncu8.err
echo "ncu8 rc=$?"
timeout 150 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis -k regex:qmma_b --launch-skip 21 --launch-count 7 \
  $B/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 3 -b 8 -n 1 --no-warmup > $OUT/sec_new8.txt 2>$OUT/sec_new8.err; echo "sec rc=$?"
echo done
