#!/bin/bash
# Session 50, call 2: where a constrained batch of 64 spends its extra time. nuvec-prof is this
# session's build (34afe74) with a temporary timer in Batcher (not committed): per decode step the host's submission, the
# raw argmax_gap read (the pass's end), the masks' bits (waiting for masks), the masked pass
# (mask_rows, argmax_gap, read), the host-sampled rows and the accepts, printed as totals. The 8B
# with Llama 3.1's vocabulary, 64 requests of 512 random tokens at once, 128 generated (the
# workload of bench/compare-constrained with BATCH=64). Then one B = 64 decode step's kernel time
# under ncu on the 8B shape cut to 4 layers (-p 16) beside that step's wall time.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-400} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; mkdir -p $B /tmp/fx $WORK $OUT/raw && tar -C $B -xJf .gpu-run/bins2.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 scripts/make-random-checkpoint.py $WORK/m8b-l3 --shape 8b --seed 0 --vocab 128256 --tokenizer /tmp/fx/llama3_1 > /tmp/mk3.log 2>&1 || tail -2 /tmp/mk3.log
python3 scripts/make-random-checkpoint.py $WORK/m8b4 --shape 8b --layers 4 --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk4.log 2>&1 || tail -2 /tmp/mk4.log
python3 - <<'PY'
import json, random
rng = random.Random(0)
requests = [{"arrival": 0.0, "max_tokens": 128, "prompt": [rng.randrange(100, 30000) for _ in range(512)]} for _ in range(64)]
json.dump({"concurrency": 64, "requests": requests}, open("/tmp/wc.json", "w"))
PY
SCHEMA=$(sed -n "s/^SCHEMA='\(.*\)'$/\1/p" bench/compare-constrained)
for c in plain any schema; do
  case $c in plain) A=();; any) A=(--regex '[^\x00]*');; schema) A=(--json-schema "$SCHEMA");; esac
  timeout 90 $B/nuvec-prof bench --device cuda --workload /tmp/wc.json --model $WORK/m8b-l3 "${A[@]}" > $OUT/raw/prof-$c.log 2>&1
  echo "$c: $(grep -oE 'generated=[0-9]+|throughput=[0-9.]+|waited [0-9.]+s' $OUT/raw/prof-$c.log | tr '\n' ' ')"; grep PROF $OUT/raw/prof-$c.log | tail -1
done
timeout 60 $B/nuvec-prof bench --model $WORK/m8b4 --device cuda -p 16 -g 128 -b 64 -n 1 2>&1 | grep -oE 'generation_tps=[0-9.]*' | head -1
NCU=/usr/local/cuda/bin/ncu
if [[ $(left) -gt 90 ]]; then
  timeout $(( $(left) - 20 )) $NCU --metrics gpu__time_duration.sum --csv -c 8000 $B/nuvec-prof bench --model $WORK/m8b4 --device cuda -p 16 -g 4 -b 64 -n 1 > /tmp/ncu.csv 2> /tmp/ncu.err
  python3 - /tmp/ncu.csv <<'PY' | tee $OUT/raw/ncu-step.txt
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; rows = rows[1:]
ki, vi = h.index("Kernel Name"), h.index("Metric Value")
seq = [(r[ki].split("(")[0].strip(), float(r[vi].replace(",", ""))) for r in rows]
ends = [i for i, (n, _) in enumerate(seq) if "argmax" in n]
print(f"{len(seq)} kernels, argmax at {ends[-8:]}")
if len(ends) < 2:
    print(collections.Counter(n for n, _ in seq).most_common(12))
else:
    step = seq[ends[-3] + 1: ends[-1] + 1] if len(ends) >= 3 and ends[-1] - ends[-2] < 4 else seq[ends[-2] + 1: ends[-1] + 1]
    tot = sum(d for _, d in step)
    print(f"last decode step: {len(step)} kernels, {tot/1e6:.3f} ms of kernel time")
    agg = collections.defaultdict(list)
    for n, d in step: agg[n].append(d)
    for n, v in sorted(agg.items(), key=lambda kv: -sum(kv[1]))[:14]:
        print(f"{len(v):5d} {sum(v)/len(v)/1000:8.2f} us {sum(v)/1000:9.1f} us {100*sum(v)/tot:5.1f}%  {n}")
PY
  tail -2 /tmp/ncu.err
fi
echo "left $(left) s"; echo done
