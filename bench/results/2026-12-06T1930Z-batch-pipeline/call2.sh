#!/bin/bash
# Session 51, call 2: pipelined steps where the host's share of a step is larger than on the 8B:
# the 1b shape (16 layers, hidden 2048, vocab 32000, 4-bit g64) at B = 64 and issue 24's workload
# on it at 64 concurrent, and the small shape (2 layers) at B = 64 over 1024 steps;
# NUVEC_BATCH_PIPELINE=0 against 1, alternated, one binary (call 1's).
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-300} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; mkdir -p $B /tmp/fx $WORK $OUT/raw
tar -C $B -xJf .gpu-run/bins3.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 scripts/make-random-checkpoint.py $WORK/m1b --shape 1b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1 || tail -2 /tmp/mk.log
python3 scripts/make-random-checkpoint.py $WORK/small --shape small --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mks.log 2>&1 || tail -2 /tmp/mks.log
python3 - <<'PY'
import sys, types
sys.path.insert(0, "bench")
from compare_serve_workload import workload
a = types.SimpleNamespace(seed=0, vocab=32000, prefix=4096, prompt=1024, requests_per_slot=2, gen=256, rate=0.0)
workload(a, 64, "/tmp/w64.json")
PY
w() { local p=$1 tag=w64-1b-p$1-r$2; local s0=$(date +%s)
  NUVEC_BATCH_PIPELINE=$p timeout 100 $B/nuvec bench --model $WORK/m1b --workload /tmp/w64.json --device cuda > $OUT/raw/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -E 'Workload (steps|results|pipeline)|rror|panick' $OUT/raw/$tag.log | tr '\n' ' ')"; }
b() { local p=$1 m=$2 tag=$3; shift 3; local s0=$(date +%s)
  NUVEC_BATCH_PIPELINE=$p timeout 100 $B/nuvec bench --model $WORK/$m --device cuda "$@" -n 1 > $OUT/raw/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -oE 'batch_size=[0-9]+|generation_tps=[0-9.]*|rror.*' $OUT/raw/$tag.log | paste -sd' ' | sed -E 's/batch_size=//g;s/generation_tps=/=/g')"; }
for r in 1 2 3; do for p in 0 1; do [[ $(left) -gt 60 ]] && b $p m1b 1b-p$p-r$r -p 128 -g 512 -b 64; done; done
for r in 1 2 3; do for p in 0 1; do [[ $(left) -gt 50 ]] && b $p small small-p$p-r$r -p 128 -g 1024 -b 64; done; done
for r in 1 2; do for p in 0 1; do [[ $(left) -gt 40 ]] && w $p $r; done; done
echo "left $(left) s"; echo done
