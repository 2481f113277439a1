#!/bin/bash
# Session 48, call 3: main after the merge's removal and the GEMV renames (f1dfd7c): GPU tests;
# then where a batched decode step of the 8B shape goes (MLX 4-bit g64 bf16 scales, 4 of its 32
# layers: scripts/make-random-checkpoint.py --shape 8b --layers 4): per-kernel durations under
# ncu of `nuvec bench -p 512 -g 8 -b 64` and `-b 32` (the last decode step's launches, and each
# kernel's total over the decode steps); then B = 1/32/64 tok/s of the 4-layer copy.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-575} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok /tmp/fx && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 scripts/make-random-checkpoint.py $WORK/m8b4 --shape 8b --layers 4 --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1; echo "mk rc $?" >> /tmp/mk.log) &
export NUVEC_GPU_FIXTURES=/tmp/fx
t() { local s=$1; shift; local s0=$(date +%s); echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "test result|panicked|FAIL|left:|right:|rror" | head -20); echo "   ($(( $(date +%s) - s0 )) s)"; }
[[ -z $SKIP_TESTS ]] && t 150 ./cuda_ops --test-threads=2
(cd $B && timeout 90 ./cuda_graph --test-threads=1 > /tmp/cg.log 2>&1; echo "cuda_graph rc $?"; tail -8 /tmp/cg.log)
t 200 ./gpu_parity --test-threads=1 --exact q4_model q8_model f16_cache_chunked_prefill bf16_rotating_cache_chunked_prompt longer_prompt_chunked_prefill rotating_cache_whole_prompt gguf_qwen3_moe_model greedy_generation_on_device_q4
while ! grep -q "mk rc" /tmp/mk.log && [[ $(left) -gt 300 ]]; do sleep 2; done; tail -2 /tmp/mk.log
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
timeout 100 $B/nuvec bench --model $WORK/m8b4 --device cuda -p 512 -g 64 -b 1,32,64 -n 1 > $OUT/raw/m8b4-bench.log 2>&1
echo "m8b4: $(grep -oE 'batch_size=[0-9]+|generation_tps=[0-9.]*' $OUT/raw/m8b4-bench.log | paste -sd' ')"
for b in 64 32; do
  [[ $(left) -lt 120 ]] && break
  timeout 170 $NCU --metrics gpu__time_duration.sum --csv -c 3000 $B/nuvec bench --model $WORK/m8b4 --device cuda -p 512 -g 8 -b $b -n 1 > /tmp/ncu-b$b.csv 2> /tmp/ncu-b$b.err
  echo "== ncu B=$b (left $(left) s)"; tail -2 /tmp/ncu-b$b.err
  python3 - /tmp/ncu-b$b.csv <<'PY' | tee $OUT/raw/ncu-b$b.txt
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; rows = rows[1:]
ki, vi = h.index("Kernel Name"), h.index("Metric Value")
seq = [(r[ki].split("(")[0], float(r[vi].replace(",", ""))) for r in rows]
print("kernels profiled:", len(seq))
# The decode steps: the launches after the last prefill-sized kernel are hard to tell apart by
# name, so take the tail: the last step is the launches after the last argmax/sampling kernel
# before the final one.
tail = seq[-400:]
agg = collections.defaultdict(list)
for n, d in tail:
    agg[n].append(d)
tot = sum(d for _, d in tail)
print(f"last 400 launches: {tot/1000:.1f} us; by kernel: count, mean us, total us, share")
for n, v in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
    print(f"{len(v):5d} {sum(v)/len(v)/1000:8.2f} {sum(v)/1000:10.1f} {100*sum(v)/tot:5.1f}%  {n}")
print("last 70 launches:")
for n, d in seq[-70:]:
    print(f"{d/1000:8.2f} us  {n}")
PY
done
echo "left $(left) s"; echo done
