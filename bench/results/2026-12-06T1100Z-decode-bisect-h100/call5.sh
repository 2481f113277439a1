#!/bin/bash
# Session 48, call 5: x staged in shared memory once per block of 8 weight tiles
# (qdec_b4_r32_x8 / _r64_x8, NUVEC_QDEC_TPB=8) against the 2-tile forms (default): cuda_bf16's
# batched-decode tests with each; nuvec bench -b 32,64 on the 8B shape at 4 layers, then all 32,
# alternated.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-520} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/fx && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 scripts/make-random-checkpoint.py $WORK/m8b4 --shape 8b --layers 4 --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1
 python3 scripts/make-random-checkpoint.py $WORK/m8b --shape 8b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 >> /tmp/mk.log 2>&1; echo "mk rc $?" >> /tmp/mk.log) &
t() { local s=$1; shift; local s0=$(date +%s); echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "test result|panicked|FAIL|left:|right:|rror" | head -20); echo "   ($(( $(date +%s) - s0 )) s)"; }
t 120 env NUVEC_QDEC_TPB=8 ./cuda_bf16 --test-threads=2 batched_decode
t 120 ./cuda_bf16 --test-threads=2 batched_decode_products_of_many
b() { local tag=$1 m=$2 tpb=$3 g=$4; local s0=$(date +%s)
  NUVEC_QDEC_TPB=$tpb timeout 120 $B/nuvec bench --model $WORK/$m --device cuda -p 512 -g $g -b 32,64 -n 1 > $OUT/raw/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -oE 'batch_size=[0-9]+|generation_tps=[0-9.]*' $OUT/raw/$tag.log | paste -sd' ' | sed -E 's/batch_size=//g;s/generation_tps=/=/g') $(grep -iE 'error|panick' $OUT/raw/$tag.log | head -2)"; }
while [[ ! -f $WORK/m8b4/config.json && $(left) -gt 300 ]]; do sleep 2; done; sleep 2
for r in 1 2; do b m8b4-t2-r$r m8b4 2 64; b m8b4-x8-r$r m8b4 8 64; done
while ! grep -q "mk rc" /tmp/mk.log && [[ $(left) -gt 150 ]]; do sleep 3; done; tail -2 /tmp/mk.log
for r in 1 2; do [[ $(left) -lt 70 ]] && break; b m8b-x8-r$r m8b 8 128; [[ $(left) -lt 70 ]] && break; b m8b-t2-r$r m8b 2 128; done
echo "left $(left) s"; echo done
