#!/bin/bash
# Device run 5: K ranges by whole waves (v3) or by the fixed 512-block target (v2), and the kernel at
# ecb0fd0 (old), alternated at B = 16 and 32.
cd "$(dirname "$0")/.."
B=.cuda-bin
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed"
run() { local bin=$1 b=$2 tag=$3; shift 3; r=$(env "$@" $B/$bin bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E "Averages|rror" | tail -1); echo "$tag B=$b $r"; }
for round in 1 2; do
  for b in 16 32; do
    run nuvec-old $b old X=1
    run nuvec-v2 $b v2 X=1
    run nuvec $b v3 X=1
  done
done
echo done
