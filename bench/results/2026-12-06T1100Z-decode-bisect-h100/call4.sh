#!/bin/bash
# Session 48, call 4 (call 3's profile took the prefill's first 3000 launches): the batched
# decode step's products and attention under ncu, kernels picked by name (few-row products
# qdec/qmma/qimma, paged kernels, the greedy pick), 8B shape at 4 layers, B = 64 and 32; and all
# kernels of the decode steps of a 16-token prompt (few prefill launches) for the small ones.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-400} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; mkdir -p $OUT/raw
[[ -d $WORK/m8b4 ]] || { mkdir -p $B /tmp/fx && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz && python3 scripts/make-random-checkpoint.py $WORK/m8b4 --shape 8b --layers 4 --seed 0 --tokenizer /tmp/fx/mistral-q4g64; }
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
print(f"kernels profiled {len(seq)}; second half {len(half)} launches, {tot/1000:.1f} us: count, mean us, total us, share")
for n, v in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
    print(f"{len(v):5d} {sum(v)/len(v)/1000:8.2f} {sum(v)/1000:10.1f} {100*sum(v)/tot:5.1f}%  {n}")
PY
}
for b in 64 32; do
  [[ $(left) -lt 100 ]] && break
  timeout 120 $NCU --metrics gpu__time_duration.sum --csv --kernel-name regex:"qdec|qmma|qimma|paged|argmax" -c 300 $B/nuvec bench --model $WORK/m8b4 --device cuda -p 512 -g 8 -b $b -n 1 > /tmp/ncu-b$b.csv 2> /tmp/ncu-b$b.err
  echo "== B=$b products and attention, 512 + 8 (left $(left) s)"; summ /tmp/ncu-b$b.csv | tee $OUT/raw/ncu-b$b.txt
done
[[ $(left) -gt 90 ]] && { timeout 120 $NCU --metrics gpu__time_duration.sum --csv -c 1500 $B/nuvec bench --model $WORK/m8b4 --device cuda -p 16 -g 8 -b 64 -n 1 > /tmp/ncu-all.csv 2> /tmp/ncu-all.err
  echo "== B=64 every kernel, 16 + 8 (left $(left) s)"; summ /tmp/ncu-all.csv | tee $OUT/raw/ncu-all.txt; }
echo "left $(left) s"; echo done
