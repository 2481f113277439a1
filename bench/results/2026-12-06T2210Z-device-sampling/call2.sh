#!/bin/bash
# Session 52, call 2: read_later fixed (page-locked buffers kept per exact length), device
# sampling on by default on a GPU, generate drawing where the logits are too. Checks: cuda_ops'
# embed_spliced (read_later of several lengths), sample_rows; gpu_batch's Batcher against solo
# runs with staged uploads (pipelined, plain, invariant) and its sampled batch. Then, settings
# alternated: the 8B workload greedy (old / staged / staged + pipelined) and sampled (host /
# device), bench -b 32,64 (old / staged / pipelined), generate at batch 1 sampled (host /
# device), the 1b workload greedy (old / staged / pipelined).
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-300} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; G=/tmp/gfx; mkdir -p $B /tmp/fx $WORK $G $OUT/raw
tar -C $B -xJf .gpu-run/bins6.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz && tar -C $G -xJf .gpu-run/gfx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[[ -f $WORK/m8b/config.json ]] && echo "mk rc 0" > /tmp/mk.log || (python3 scripts/make-random-checkpoint.py $WORK/m8b --shape 8b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1; echo "mk rc $?" >> /tmp/mk.log) &
[[ -f $WORK/m1b/config.json ]] && echo "mk rc 0" > /tmp/mk1.log || (python3 scripts/make-random-checkpoint.py $WORK/m1b --shape 1b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk1.log 2>&1; echo "mk rc $?" >> /tmp/mk1.log) &
python3 - <<'PY'
import sys, types
sys.path.insert(0, "bench")
from compare_serve_workload import workload
a = types.SimpleNamespace(seed=0, vocab=32000, prefix=4096, prompt=1024, requests_per_slot=2, gen=256, rate=0.0)
workload(a, 64, "/tmp/w64.json")
PY
(cd $B && timeout 120 ./cuda_ops --test-threads=1 sample_rows embed_spliced 2>&1 | tee $OUT/raw/cuda_ops.log | grep -E "^test |test result|panicked|assert" | head -8)
(cd $B && NUVEC_GPU_FIXTURES=$G timeout 120 ./gpu_batch --test-threads=1 --nocapture sampled_requests 2>&1 | tee $OUT/raw/gpu_batch_sampled.log | grep -E "RESULT|test result|panicked|left|right" | head -8)
(cd $B && NUVEC_STAGED_UPLOADS=1 NUVEC_GPU_FIXTURES=$G timeout 200 ./gpu_batch --test-threads=1 --nocapture the_batcher_serves 2>&1 | tee $OUT/raw/gpu_batch.log | grep -E "RESULT|test result|panicked|left|right" | head -14)
while ! grep -q "mk rc" /tmp/mk.log && [[ $(left) -gt 60 ]]; do sleep 3; done; tail -1 /tmp/mk.log
set_of() { case $1 in old) echo "NUVEC_STAGED_UPLOADS=0 NUVEC_BATCH_PIPELINE=0";; st) echo "NUVEC_STAGED_UPLOADS=1 NUVEC_BATCH_PIPELINE=0";;
  pipe) echo "NUVEC_STAGED_UPLOADS=1 NUVEC_BATCH_PIPELINE=1";; hs) echo "NUVEC_DEVICE_SAMPLING=0 NUVEC_STAGED_UPLOADS=0";; ds) echo "NUVEC_DEVICE_SAMPLING=1 NUVEC_STAGED_UPLOADS=0";; esac; }
w() { local m=$1 c=$2 tag=w64-$1-$2-r$3; shift 3; local s0=$(date +%s)
  env $(set_of $c) timeout 100 $B/nuvec bench --model $WORK/$m --workload /tmp/w64.json --device cuda "$@" > $OUT/raw/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -E 'Workload (steps|results|pipeline|sampling)|rror|panick' $OUT/raw/$tag.log | tr '\n' ' ')"; }
b() { local m=$1 c=$2 tag=$1-$2-r$3; shift 3; local s0=$(date +%s)
  env $(set_of $c) timeout 100 $B/nuvec bench --model $WORK/$m --device cuda "$@" -n 1 > $OUT/raw/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -oE 'batch_size=[0-9]+|generation_tps=[0-9.]*|rror.*' $OUT/raw/$tag.log | paste -sd' ' | sed -E 's/batch_size=//g;s/generation_tps=/=/g')"; }
for c in old st pipe; do [[ $(left) -gt 60 ]] && w m8b $c 1; done
g() { local c=$1 tag=gen-$1-r$2; local s0=$(date +%s)
  env $(set_of $c) timeout 60 $B/nuvec generate --model $WORK/m8b --device cuda --prompt "Once upon a time" -m 256 --temp 1.0 --seed 3 --ignore-eos > $OUT/raw/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -iE 'generation|rror' $OUT/raw/$tag.log | tr '\n' ' ')"; }
for c in hs ds; do [[ $(left) -gt 50 ]] && g $c 1; done
while ! grep -q "mk rc" /tmp/mk1.log && [[ $(left) -gt 40 ]]; do sleep 3; done
for c in old st pipe; do [[ $(left) -gt 20 ]] && w m1b $c 1; done
for c in old st pipe; do [[ $(left) -gt 20 ]] && b m8b $c 1 -p 512 -g 128 -b 32,64; done
for c in pipe st old; do [[ $(left) -gt 20 ]] && w m8b $c 2; done
for c in hs ds; do [[ $(left) -gt 20 ]] && g $c 2; done
echo "left $(left) s"; echo done
