#!/bin/bash
# Call 1: the router's product and top-k in one launch (moe_route_dense). Tests (cuda_moe,
# gpu_parity's GGUF MoE cases), then the Qwen3-30B-A3B GGUF (48 layers, Q4_0): main's binary
# (nuvec-main) against this one (nuvec) alternated, llama-bench on the same file; an ncu pass over
# a 2-layer copy (caches not flushed) if time is left.
cd "$(dirname "$0")/.."
T0=$(date +%s); left() { echo $((${BUDGET:-570} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok /tmp/fx && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
SRC=$(bench/llama-cpp source)
LB=$HOME/.cache/nuvec/llama.cpp-0.3.36-cuda/bin/llama-bench
(bench/llama-cpp build cuda llama-bench > /tmp/llama-build.log 2>&1; echo "build rc $?" >> /tmp/llama-build.log) &
(date; PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/a.part --arch qwen3-30b-a3b --tokenizer /tmp/tok/qwen3 && mv $WORK/a.part $WORK/a3b48.gguf; date
 PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/a2.part --arch qwen3-30b-a3b --layers 2 --tokenizer /tmp/tok/qwen3 && mv $WORK/a2.part $WORK/a3b2.gguf) > /tmp/gguf.log 2>&1 &
export NUVEC_GPU_FIXTURES=/tmp/fx
t() { local s=$1; shift; echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "^test .*(FAIL|ok$)|test result|panicked|assert|FAIL|left:|right:" | head -30); }
t 150 ./cuda_moe --test-threads=2
t 150 ./gpu_parity --test-threads=1 --exact gguf_qwen3_moe_model gguf_gpt_oss_model
echo "left $(left) s"; cat /tmp/gguf.log
b() { local e=$1 m=$2 tag=$3; shift 3
  timeout 150 $B/$e bench --model $m --device cuda "$@" > $OUT/raw/$e-$tag.log 2>&1
  echo "$e $tag: $(grep -oE '(prompt|generation)_tps=[0-9.]*' $OUT/raw/$e-$tag.log | tr '\n' ' ') $(grep -iE 'error|panick' $OUT/raw/$e-$tag.log | head -2)"; }
l() { local m=$1 tag=$2; [[ -x "$LB" ]] || { echo "no llama-bench yet: $(tail -n 1 /tmp/llama-build.log)"; return; }
  timeout 150 $LB -m $m -ngl 99 -fa 1 -p 0 -n 128 -d 512 -r 2 > $OUT/raw/llama-$tag.log 2>&1; echo "llama $tag: $(grep -E 'tg128' $OUT/raw/llama-$tag.log)"; }
while [[ ! -f $WORK/a3b48.gguf && $(left) -gt 150 ]]; do sleep 3; done
for r in 1 2; do for e in nuvec-main nuvec llama; do [[ $(left) -lt 70 ]] && break 2
  if [[ $e == llama ]]; then l $WORK/a3b48.gguf a3b48-r$r; else b $e $WORK/a3b48.gguf a3b48-r$r -p 512 -g 128 -n 2; fi; done; done
tail -n 1 /tmp/llama-build.log
if [[ -f $WORK/a3b2.gguf && $(left) -gt 90 ]]; then
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
NUVEC_CUDA_GRAPHS=0 timeout $(( $(left) - 15 )) $NCU --cache-control none --metrics gpu__time_duration.sum --csv -c 400 $B/nuvec bench --model $WORK/a3b2.gguf --device cuda -p 32 -g 16 -n 1 > $OUT/raw/ncu-a3b2.csv 2> $OUT/raw/ncu-a3b2.err
python3 - $OUT/raw/ncu-a3b2.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; rows = rows[1:]
ki, vi = h.index("Kernel Name"), h.index("Metric Value")
seq = [(r[ki].split("(")[0].split("<")[0], float(r[vi].replace(",", ""))) for r in rows]
print("kernels profiled:", len(seq))
for n, d in seq[-32:]: print(f"{d/1000:8.2f} us  {n}")
PY
fi
echo "left $(left) s"; echo done
