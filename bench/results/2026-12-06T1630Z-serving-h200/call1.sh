#!/bin/bash
# Session 50, call 1 (asked as an H200: issues 23's, 24's and 26's targets are H200 figures).
# nuvec = this session's build (the masks' wait in the Batcher's stats; constrained rows take their
# tokens into their grammars on the masks' pool, all at once); nuvec-main = main (2e4e544). The 8B
# MLX shape (4-bit g64, bf16 scales, vocab 32000) at B = 1 / 32 / 64 twice; issue 26's
# constrained batch of 64 (the 8B with Llama 3.1's vocabulary, bench/compare-constrained), this
# build then main; issue 24's workload at 64 concurrent; then the kernels' time of one B = 64
# decode step under ncu against the step's wall time (-p 16): how much of a batched step the
# device idles.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-560} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; mkdir -p $B /tmp/fx $WORK $OUT/raw && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 scripts/make-random-checkpoint.py $WORK/m8b --shape 8b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1; echo "mk rc $?" >> /tmp/mk.log) &
(python3 scripts/make-random-checkpoint.py $WORK/m8b-l3 --shape 8b --seed 0 --vocab 128256 --tokenizer /tmp/fx/llama3_1 > /tmp/mk3.log 2>&1; echo "mk rc $?" >> /tmp/mk3.log) &
python3 - <<'PY'
import sys, types
sys.path.insert(0, "bench")
from compare_serve_workload import workload
a = types.SimpleNamespace(seed=0, vocab=32000, prefix=4096, prompt=1024, requests_per_slot=2, gen=256, rate=0.0)
workload(a, 64, "/tmp/w64.json")
PY
while ! grep -q "mk rc" /tmp/mk.log && [[ $(left) -gt 200 ]]; do sleep 3; done; tail -1 /tmp/mk.log; echo "made in $(( $(date +%s) - T0 )) s"
b() { local tag=$1; shift; local s0=$(date +%s)
  timeout 120 $B/nuvec bench --model $WORK/m8b --device cuda "$@" -n 1 > $OUT/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -oE 'batch_size=[0-9]+|generation_tps=[0-9.]*' $OUT/$tag.log | paste -sd' ' | sed -E 's/batch_size=//g;s/generation_tps=/=/g')"; }
w() { local tag=$1; shift; local s0=$(date +%s)
  timeout 120 $B/nuvec bench --model $WORK/m8b --workload /tmp/w64.json --device cuda > $OUT/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -E 'Workload (steps|results)|rror|panick' $OUT/$tag.log | tr '\n' ' ')"; }
b main-r1 -p 512 -g 128 -b 1,32,64
while ! grep -q "mk rc" /tmp/mk3.log && [[ $(left) -gt 200 ]]; do sleep 3; done; tail -1 /tmp/mk3.log
for bin in nuvec nuvec-main; do
  [[ $(left) -gt 200 ]] && DEVICE=cuda GEN=128 ROUNDS=1 BATCH=64 PROMPT=512 NUVEC_BIN=$B/$bin timeout 150 bench/compare-constrained $WORK/m8b-l3 2>&1 | tee $OUT/raw/constrained64-$bin.log | grep -E "round|x,"
done
b main-r2 -p 512 -g 128 -b 1,32,64
[[ $(left) -gt 150 ]] && w w64-r1
[[ $(left) -gt 150 ]] && b p16 -p 16 -g 128 -b 64
NCU=/usr/local/cuda/bin/ncu
if [[ $(left) -gt 60 ]]; then
  timeout $(( $(left) - 15 )) $NCU --metrics gpu__time_duration.sum --csv -c 4000 $B/nuvec bench --model $WORK/m8b --device cuda -p 16 -g 3 -b 64 -n 1 > /tmp/ncu.csv 2> /tmp/ncu.err
  python3 - /tmp/ncu.csv <<'PY' | tee $OUT/raw/ncu-step.txt
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; rows = rows[1:]
ki, vi, ii = h.index("Kernel Name"), h.index("Metric Value"), h.index("ID")
seq = [(r[ki].split("(")[0].strip(), float(r[vi].replace(",", ""))) for r in rows]
ends = [i for i, (n, _) in enumerate(seq) if n.startswith("argmax")]
print(f"{len(seq)} kernels, argmax at {ends[-6:]}")
if len(ends) >= 2:
    step = seq[ends[-2] + 1: ends[-1] + 1]
    tot = sum(d for _, d in step)
    print(f"last decode step: {len(step)} kernels, {tot/1e6:.3f} ms of kernel time")
    agg = collections.defaultdict(list)
    for n, d in step: agg[n].append(d)
    for n, v in sorted(agg.items(), key=lambda kv: -sum(kv[1]))[:16]:
        print(f"{len(v):5d} {sum(v)/len(v)/1000:8.2f} us {sum(v)/1000:9.1f} us {100*sum(v)/tot:5.1f}%  {n}")
PY
  tail -3 /tmp/ncu.err
fi
echo "left $(left) s"; echo done
