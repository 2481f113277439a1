#!/bin/bash
# Device run (nineteenth session): qmma's split-K slices added by the last block of each column
# (qm_finish) instead of qmma_reduce: correctness, then old (6d406ca) and new alternated.
cd "$(dirname "$0")/.."
mkdir -p /tmp/old /tmp/new && tar -C /tmp/old -xJf .cuda-bin/bins.tar.xz && tar -C /tmp/new -xJf .cuda-bin/new.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core
(cd /tmp/new && timeout 150 ./cuda_bf16 --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | head -20)
(cd /tmp/new && timeout 150 ./gpu_batch --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right" | head -10)
(cd /tmp/new && timeout 200 ./gpu_parity --test-threads=1 q4_model q8_model greedy_generation_on_device 2>&1 | grep -E "^test |test result|panicked" | head -10)
wait
run() { local dir=$1 b=$2; echo "$dir B=$b $(/tmp/$dir/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E 'Averages|rror' | tail -1)"; }
for round in 1 2; do for b in 8 16 32; do run old $b; run new $b; done; done
for b in 2 4; do run old $b; run new $b; done
echo done
