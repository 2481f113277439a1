#!/bin/bash
# Device run 7: bf16-x kernel (m16) for 2-8 rows instead of x3; ncu of B=16 and B=8 under it.
cd "$(dirname "$0")/.."
B=.cuda-bin
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed"
run() { local b=$1 tag=$2; shift 2; r=$(env "$@" $B/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E "Averages|rror" | tail -1); echo "$tag B=$b $r"; }
for b in 2 4 8; do run $b x3 X=1; run $b m16 NUVEC_QMMA_X3=0; done
run 16 m16 X=1
timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv -f \
  $B/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 4 -b 16 -n 1 --no-warmup > $OUT/ncu16.csv 2>$OUT/ncu16.err
echo "ncu16 rc=$?"
NUVEC_QMMA_X3=0 timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv -f \
  $B/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 4 -b 8 -n 1 --no-warmup > $OUT/ncu8m16.csv 2>$OUT/ncu8m16.err
echo "ncu8m16 rc=$?"
echo done
