#!/bin/bash
# Session 51, call 1: pipelined Batcher steps (each step fed the step before's greedy picks on the
# device, enqueued before they are read). Checks first: cuda_ops' embed_spliced / read_later, and
# gpu_batch's Batcher against solo runs, pipelined (the default on a GPU), unpipelined and
# batch-invariant. Then NUVEC_BATCH_PIPELINE=0 against 1 alternated, one binary: issue 24's
# workload at 64 concurrent on the 8B MLX shape (4-bit g64, bf16 scales, vocab 32000), bench -b
# 1,32,64 there, and bench -b 64 on the small shape, where the host's share of a step is larger.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-540} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; G=/tmp/gfx; mkdir -p $B /tmp/fx $WORK $G $OUT/raw
tar -C $B -xJf .gpu-run/bins3.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz && tar -C $G -xJf .gpu-run/gfx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 scripts/make-random-checkpoint.py $WORK/m8b --shape 8b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1; echo "mk rc $?" >> /tmp/mk.log) &
(python3 scripts/make-random-checkpoint.py $WORK/small --shape small --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mks.log 2>&1; echo "mk rc $?" >> /tmp/mks.log) &
python3 - <<'PY'
import sys, types
sys.path.insert(0, "bench")
from compare_serve_workload import workload
a = types.SimpleNamespace(seed=0, vocab=32000, prefix=4096, prompt=1024, requests_per_slot=2, gen=256, rate=0.0)
workload(a, 64, "/tmp/w64.json")
PY
(cd $B && timeout 60 ./cuda_ops --test-threads=1 embed_spliced 2>&1 | tee $OUT/raw/cuda_ops.log | grep -E "^test |test result|panicked" | head -5)
(cd $B && NUVEC_GPU_FIXTURES=$G timeout 150 ./gpu_batch --test-threads=1 --nocapture the_batcher_serves 2>&1 | tee $OUT/raw/gpu_batch.log | grep -E "RESULT|test result|panicked|left|right" | head -14)
while ! grep -q "mk rc" /tmp/mk.log && [[ $(left) -gt 200 ]]; do sleep 3; done; tail -1 /tmp/mk.log
w() { local p=$1 tag=w64-p$1-r$2; local s0=$(date +%s)
  NUVEC_BATCH_PIPELINE=$p timeout 100 $B/nuvec bench --model $WORK/m8b --workload /tmp/w64.json --device cuda > $OUT/raw/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -E 'Workload (steps|results)|rror|panick' $OUT/raw/$tag.log | tr '\n' ' ')"; }
b() { local p=$1 m=$2 tag=$3; shift 3; local s0=$(date +%s)
  NUVEC_BATCH_PIPELINE=$p timeout 100 $B/nuvec bench --model $WORK/$m --device cuda "$@" -n 1 > $OUT/raw/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -oE 'batch_size=[0-9]+|generation_tps=[0-9.]*|rror.*' $OUT/raw/$tag.log | paste -sd' ' | sed -E 's/batch_size=//g;s/generation_tps=/=/g')"; }
for r in 1 2; do for p in 0 1; do [[ $(left) -gt 120 ]] && w $p $r; done; done
for r in 1 2; do for p in 0 1; do [[ $(left) -gt 90 ]] && b $p m8b m8b-p$p-r$r -p 512 -g 128 -b 1,32,64; done; done
while ! grep -q "mk rc" /tmp/mks.log && [[ $(left) -gt 40 ]]; do sleep 3; done
for r in 1 2; do for p in 0 1; do [[ $(left) -gt 30 ]] && b $p small small-p$p-r$r -p 128 -g 128 -b 64; done; done
echo "left $(left) s"; echo done
