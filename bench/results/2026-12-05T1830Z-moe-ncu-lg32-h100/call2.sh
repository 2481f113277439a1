#!/bin/bash
# Device call 2: per-kernel durations of a 2-layer A3B GGUF's decode step (ncu, graphs off), then
# the 8B Q4_0 GGUF at B = 16/32/64: this binary (nuvec) against wip-qmma-lg32 (nuvec-lg32).
cd "$(dirname "$0")/.."
T0=$(date +%s); left() { echo $((585 - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok && tar -C $B -xJf .gpu-run/bins4.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok3.tar.xz
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
SRC=$(bench/llama-cpp source)
(PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/a3b.part --arch qwen3-30b-a3b --layers 2 --tokenizer /tmp/tok/qwen3 && mv $WORK/a3b.part $WORK/a3b2.gguf
 PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/l8b.part --arch llama-3.1-8b --tokenizer /tmp/tok/llama3_1 && mv $WORK/l8b.part $WORK/l8b.gguf) > /tmp/gguf.log 2>&1 &
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
while [[ ! -f $WORK/a3b2.gguf && $(left) -gt 400 ]]; do sleep 2; done
# Warm the driver's JIT cache first (the first CUDA process compiles every module).
timeout 200 $B/nuvec bench --model $WORK/a3b2.gguf --device cuda -p 32 -g 16 -n 1 2>&1 | grep -oE 'generation_tps=[0-9.]*'
echo "left $(left) s"
if [[ -n "$NCU" ]]; then
  NUVEC_CUDA_GRAPHS=0 timeout 200 $NCU --metrics gpu__time_duration.sum --csv -c 700 $B/nuvec bench --model $WORK/a3b2.gguf --device cuda -p 32 -g 16 -n 1 > $OUT/raw/ncu-a3b2.csv 2> $OUT/raw/ncu-a3b2.err
  python3 - $OUT/raw/ncu-a3b2.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; rows = rows[1:]
ki, vi, ii = h.index("Kernel Name"), h.index("Metric Value"), h.index("ID")
seq = [(r[ki].split("(")[0], float(r[vi].replace(",", ""))) for r in rows]
print("kernels profiled:", len(seq))
# The last 60 launches: the tail of the decode (steps of 2 layers).
for n, d in seq[-60:]:
    print(f"{d/1000:8.2f} us  {n}")
agg = collections.defaultdict(list)
for n, d in seq[len(seq)//2:]:
    agg[n].append(d)
print("second half, by kernel: count, mean us, total us")
for n, v in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
    print(f"{len(v):5d} {sum(v)/len(v)/1000:8.2f} {sum(v)/1000:10.1f}  {n}")
PY
  tail -3 $OUT/raw/ncu-a3b2.err
fi
echo "left $(left) s"
while [[ ! -f $WORK/l8b.gguf && $(left) -gt 200 ]]; do sleep 2; done
for r in 1 2; do for e in nuvec nuvec-lg32; do
  [[ $(left) -lt 90 ]] && break 2
  timeout 120 $B/$e bench --model $WORK/l8b.gguf --device cuda -p 512 -g 128 -b 16,32,64 -n 1 > $OUT/raw/$e-l8b-r$r.log 2>&1
  echo "$e r$r: $(grep -oE 'generation_tps=[0-9.]*' $OUT/raw/$e-l8b-r$r.log | tr '\n' ' ') $(grep -iE 'error|panick' $OUT/raw/$e-l8b-r$r.log | head -2)"
done; done
echo "left $(left) s"; echo done
