#!/bin/bash
# Device run 6: the final rule (K ranges by whole waves of each kernel's own occupancy): the batched
# product test, then B = 16 and 32 once each.
cd "$(dirname "$0")/.."
B=.cuda-bin
(cd $B && timeout 100 ./cuda_bf16 --test-threads=1 batched_decode 2>&1 | grep -E "^test |test result|panicked" | head -5)
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed"
for b in 16 32; do r=$($B/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E "Averages|rror" | tail -1); echo "final B=$b $r"; done
echo done
