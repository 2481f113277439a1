#!/bin/bash
# Session 49, call 1: the warpgroup-MMA products (qwg_b4_r32 / _r64) on the device. cuda_bf16's
# batched-decode tests with NUVEC_QDEC_WGMMA=1 (every 17-64-row bf16-scale product through them)
# first; then the 8B MLX shape (32 layers) at B = 1 / 32 / 64 with NUVEC_QDEC_WGMMA = 0 (the
# register kernels, main's behaviour), unset (qwg where its blocks fill half the slots: gate/up)
# and 1 (every product), alternated; then the products' kernel times under ncu at B = 64 on
# 4 layers, for 0 and 1.
# Knob values of that build: unset took qwg where its blocks fill half the slots (today's default),
# 1 every 17-64-row bf16-scale product with K whole (no ranges yet).
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-540} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; mkdir -p $B /tmp/fx $WORK $OUT/raw && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 scripts/make-random-checkpoint.py $WORK/m8b --shape 8b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1; python3 scripts/make-random-checkpoint.py $WORK/m8b4 --shape 8b --layers 4 --seed 0 --tokenizer /tmp/fx/mistral-q4g64 >> /tmp/mk.log 2>&1; echo "mk rc $?" >> /tmp/mk.log) &
(cd $B && NUVEC_QDEC_WGMMA=1 timeout 200 ./cuda_bf16 --test-threads=2 batched_decode 2>&1 | tee $OUT/raw/cuda_bf16.log | grep -E "test result|panicked|FAIL|mismatch|differ" | head -20)
while ! grep -q "mk rc" /tmp/mk.log && [[ $(left) -gt 200 ]]; do sleep 3; done; tail -2 /tmp/mk.log
b() { local tag=$1 mode=$2; local s0=$(date +%s)
  if [[ $mode == unset ]]; then timeout 120 $B/nuvec bench --model $WORK/m8b --device cuda -p 512 -g 128 -b 1,32,64 -n 1 > $OUT/$tag.log 2>&1
  else NUVEC_QDEC_WGMMA=$mode timeout 120 $B/nuvec bench --model $WORK/m8b --device cuda -p 512 -g 128 -b 1,32,64 -n 1 > $OUT/$tag.log 2>&1; fi
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -oE 'batch_size=[0-9]+|generation_tps=[0-9.]*' $OUT/$tag.log | paste -sd' ' | sed -E 's/batch_size=//g;s/generation_tps=/=/g')"; }
for r in 1 2; do for mode in 0 unset 1; do [[ $(left) -lt 150 ]] && break 2; b wg$mode-r$r $mode; done; done
NCU=/usr/local/cuda/bin/ncu
summ() { python3 - "$1" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows: print("no rows"); sys.exit()
h = rows[0]; rows = rows[1:]
ki, vi = h.index("Kernel Name"), h.index("Metric Value")
seq = [(r[ki].split("(")[0], float(r[vi].replace(",", ""))) for r in rows]
half = seq[len(seq) // 2:]
agg = collections.defaultdict(list)
for n, d in half: agg[n].append(d)
tot = sum(d for _, d in half)
print(f"second half {len(half)} launches, {tot/1000:.1f} us: count, mean us, total us, share")
for n, v in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
    print(f"{len(v):5d} {sum(v)/len(v)/1000:8.2f} {sum(v)/1000:10.1f} {100*sum(v)/tot:5.1f}%  {n}")
PY
}
for mode in 0 1; do
  [[ $(left) -lt 60 ]] && break
  NUVEC_QDEC_WGMMA=$mode timeout 100 $NCU --metrics gpu__time_duration.sum --csv --kernel-name regex:"qdec|qwg|xwg|qmma|qimma|paged" -c 200 $B/nuvec bench --model $WORK/m8b4 --device cuda -p 512 -g 8 -b 64 -n 1 > /tmp/ncu-$mode.csv 2> /tmp/ncu-$mode.err
  echo "== B=64 products, NUVEC_QDEC_WGMMA=$mode (left $(left) s)"; summ /tmp/ncu-$mode.csv | tee $OUT/raw/ncu-wg$mode.txt | head -14
done
echo "left $(left) s"; echo done
