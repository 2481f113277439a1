#!/bin/bash
# Session 49, call 3 (an H200 if one comes: issue 23's and 24's targets are H200 figures): the
# default (warpgroup kernels where their blocks fill half the GPU with K whole: an 8B's gate/up)
# against NUVEC_QDEC_WGMMA=0 (main before). gpu_batch's bf16-scaled batches (6 and 40 sequences
# against each alone) under the default and under NUVEC_QDEC_WGMMA=1 (every product of the tiny
# model through qwg); the 8B MLX shape at B = 1 / 32 / 64 alternated twice; issue 24's workload
# at 64 concurrent (128 requests at once, 1k prompts, half after a 4k shared prefix, 256
# generated each) alternated.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-540} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; G=/tmp/gf; mkdir -p $B /tmp/fx $WORK $G $OUT/raw && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 scripts/make-random-checkpoint.py $WORK/m8b --shape 8b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1; echo "mk rc $?" >> /tmp/mk.log) &
python3 scripts/make-random-checkpoint.py $G/random-tiny-q4 --shape tiny --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mkt.log 2>&1 || tail -3 /tmp/mkt.log
for mode in unset 1; do
  (cd $B && env $([[ $mode == 1 ]] && echo NUVEC_QDEC_WGMMA=1 || echo X=1) NUVEC_GPU_FIXTURES=$G timeout 150 ./gpu_batch --test-threads=1 --nocapture bf16_scaled 2>&1 | tee $OUT/raw/gpu_batch-$mode.log | grep -E "RESULT|test result|panicked|differ|another" | head -8)
done
python3 - <<'PY'
import sys, types
sys.path.insert(0, "bench")
from compare_serve_workload import workload
a = types.SimpleNamespace(seed=0, vocab=32000, prefix=4096, prompt=1024, requests_per_slot=2, gen=256, rate=0.0)
workload(a, 64, "/tmp/w64.json")
PY
while ! grep -q "mk rc" /tmp/mk.log && [[ $(left) -gt 200 ]]; do sleep 3; done; tail -2 /tmp/mk.log
b() { local tag=$1; shift; local s0=$(date +%s)
  env "$@" timeout 120 $B/nuvec bench --model $WORK/m8b --device cuda -p 512 -g 128 -b 1,32,64 -n 1 > $OUT/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -oE 'batch_size=[0-9]+|generation_tps=[0-9.]*' $OUT/$tag.log | paste -sd' ' | sed -E 's/batch_size=//g;s/generation_tps=/=/g')"; }
w() { local tag=$1; shift; local s0=$(date +%s)
  env "$@" timeout 120 $B/nuvec bench --model $WORK/m8b --workload /tmp/w64.json --device cuda > $OUT/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -E 'Workload results|rror|panick' $OUT/$tag.log | tr '\n' ' ')"; }
for r in 1 2; do
  [[ $(left) -lt 120 ]] && break
  b wg0-r$r NUVEC_QDEC_WGMMA=0; b default-r$r X=1
done
for r in 1 2; do
  [[ $(left) -lt 60 ]] && break
  w w64-default-r$r X=1; [[ $(left) -lt 40 ]] && break; w w64-wg0-r$r NUVEC_QDEC_WGMMA=0
done
echo "left $(left) s"; echo done
