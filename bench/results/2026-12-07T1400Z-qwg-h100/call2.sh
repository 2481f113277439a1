#!/bin/bash
# Session 49, call 2: the warpgroup products with K cut into ranges where their blocks alone would
# not fill the GPU (partial slices added by qmma_reduce), now the default on sm_90. cuda_bf16's
# batched-decode tests under the default (every 17-64-row bf16-scale product through qwg, the
# 1,000-row weights in many ranges) and under NUVEC_QDEC_WGMMA=0; then the 8B MLX shape at
# B = 1 / 32 / 64 with NUVEC_QDEC_WGMMA = 0 (register kernels), fill (qwg for gate/up only, K
# whole: call 1's default) and 1 (every product), alternated twice, 1 with QIR_RING=4 (deeper
# copies ahead) and 1 with QWG_OVERLAP=1 (a batch's wgmma running into the next turn); then the products' kernel times under ncu at B = 64 on 4 layers for 1.
# Knob values of that build: `fill` is today's default (unset), and unset then meant today's 1.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-540} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; mkdir -p $B /tmp/fx $WORK $OUT/raw && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 scripts/make-random-checkpoint.py $WORK/m8b --shape 8b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1; python3 scripts/make-random-checkpoint.py $WORK/m8b4 --shape 8b --layers 4 --seed 0 --tokenizer /tmp/fx/mistral-q4g64 >> /tmp/mk.log 2>&1; echo "mk rc $?" >> /tmp/mk.log) &
(cd $B && timeout 200 ./cuda_bf16 --test-threads=2 batched_decode 2>&1 | tee $OUT/raw/cuda_bf16.log | grep -E "test result|panicked|FAIL|differ" | head -20
 NUVEC_QDEC_WGMMA=0 timeout 100 ./cuda_bf16 --test-threads=2 batched_decode_products_on 2>&1 | tee $OUT/raw/cuda_bf16-wg0.log | grep -E "test result|panicked|FAIL|differ" | head -20)
while ! grep -q "mk rc" /tmp/mk.log && [[ $(left) -gt 200 ]]; do sleep 3; done; tail -2 /tmp/mk.log
b() { local tag=$1; shift; local s0=$(date +%s)
  env "$@" timeout 120 $B/nuvec bench --model $WORK/m8b --device cuda -p 512 -g 128 -b 1,32,64 -n 1 > $OUT/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -oE 'batch_size=[0-9]+|generation_tps=[0-9.]*' $OUT/$tag.log | paste -sd' ' | sed -E 's/batch_size=//g;s/generation_tps=/=/g')"; }
for r in 1 2; do
  [[ $(left) -lt 150 ]] && break
  b wg0-r$r NUVEC_QDEC_WGMMA=0; b wgfill-r$r NUVEC_QDEC_WGMMA=fill; b wg1-r$r NUVEC_QDEC_WGMMA=1; b wg1ring4-r$r NUVEC_QDEC_WGMMA=1 NUVEC_NVRTC_DEFINES=QIR_RING=4; b wg1ov-r$r NUVEC_QDEC_WGMMA=1 NUVEC_NVRTC_DEFINES=QWG_OVERLAP=1
done
NCU=/usr/local/cuda/bin/ncu
summ() { python3 - "$1" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows: print("no rows"); sys.exit()
h = rows[0]; rows = rows[1:]
ki, vi, gi = h.index("Kernel Name"), h.index("Metric Value"), h.index("Grid Size") if "Grid Size" in h else None
seq = [(r[ki].split("(")[0] + (" grid " + r[gi] if gi is not None else ""), float(r[vi].replace(",", ""))) for r in rows]
half = seq[len(seq) // 2:]
agg = collections.defaultdict(list)
for n, d in half: agg[n].append(d)
tot = sum(d for _, d in half)
print(f"second half {len(half)} launches, {tot/1000:.1f} us: count, mean us, total us, share")
for n, v in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
    print(f"{len(v):5d} {sum(v)/len(v)/1000:8.2f} {sum(v)/1000:10.1f} {100*sum(v)/tot:5.1f}%  {n}")
PY
}
if [[ $(left) -gt 60 ]]; then
  NUVEC_QDEC_WGMMA=1 timeout 100 $NCU --metrics gpu__time_duration.sum --print-units base --csv --kernel-name regex:"qdec|qwg|xwg|qmma|qimma|paged" -c 240 $B/nuvec bench --model $WORK/m8b4 --device cuda -p 512 -g 8 -b 64 -n 1 > /tmp/ncu-1.csv 2> /tmp/ncu-1.err
  echo "== B=64 products, NUVEC_QDEC_WGMMA=1 (left $(left) s)"; summ /tmp/ncu-1.csv | tee $OUT/raw/ncu-wg1.txt | head -16
fi
echo "left $(left) s"; echo done
