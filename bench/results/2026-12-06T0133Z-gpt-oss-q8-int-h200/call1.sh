#!/bin/bash
# Device call 1: the int8 mxfp4 expert kernels, the int gate/up writing the activations' parts,
# fused biases and the router bias checked on the GPU (cuda_moe, cuda_ops, gpu_parity's GGUF
# gpt-oss, the 8-bit mistral), then gpt-oss-20b's GGUF (24 layers) decode: aae8631 (nuvec-prev),
# f1f0838 (nuvec-main), this session's (nuvec: gpt-oss's fused residual norms and o bias, the
# 8-bit integer GEMVs), alternated; llama-bench on the
# same file once its build (started first) is done.
cd "$(dirname "$0")/.."
T0=$(date +%s); left() { echo $((${BUDGET:-585} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok /tmp/fx && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
lscpu | grep -m1 'Model name'
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
SRC=$(bench/llama-cpp source)
LB=$HOME/.cache/nuvec/llama.cpp-0.3.36-cuda/bin/llama-bench
(bench/llama-cpp build cuda llama-bench > /tmp/llama-build.log 2>&1; echo "build rc $?" >> /tmp/llama-build.log) &
(PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/oss.part --arch gpt-oss-20b --tokenizer /tmp/tok/gptoss && mv $WORK/oss.part $WORK/oss24.gguf
 PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/oss2.part --arch gpt-oss-20b --layers 2 --tokenizer /tmp/tok/gptoss && mv $WORK/oss2.part $WORK/oss2.gguf) > /tmp/gguf.log 2>&1 &
export NUVEC_GPU_FIXTURES=/tmp/fx
t() { local s=$1; shift; echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "^test .*(FAIL|ok$)|test result|panicked|assert|FAIL|max|rounding" | head -40); }
t 150 ./cuda_moe --test-threads=2
t 120 ./cuda_ops --test-threads=2 bias linear_quantized_every_width linear_many
t 150 ./gpu_parity --test-threads=1 --exact gguf_gpt_oss_model q8_model
echo "left $(left) s"; tail -n 2 /tmp/gguf.log
b() { local e=$1 m=$2 tag=$3; shift 3
  timeout 120 $B/$e bench --model $m --device cuda "$@" > $OUT/raw/$e-$tag.log 2>&1
  echo "$e $tag: $(grep -E 'Averages|CUDA graphs|rror|panick' $OUT/raw/$e-$tag.log | head -4)"; }
l() { local m=$1 tag=$2; [[ -x "$LB" ]] || { echo "no llama-bench yet: $(tail -n 1 /tmp/llama-build.log)"; return; }
  timeout 120 $LB -m $m -ngl 99 -fa 1 -p 0 -n 128 -d 512 -r 2 > $OUT/raw/llama-$tag.log 2>&1; echo "llama $tag: $(grep -E 'tg128' $OUT/raw/llama-$tag.log)"; }
while [[ ! -f $WORK/oss24.gguf && $(left) -gt 150 ]]; do sleep 3; done
for r in 1 2; do for e in nuvec-prev nuvec-main nuvec llama; do [[ $(left) -lt 50 ]] && break 2
  if [[ $e == llama ]]; then l $WORK/oss24.gguf oss24-r$r; else b $e $WORK/oss24.gguf oss24-r$r -p 512 -g 128 -n 2; fi; done; done
tail -n 1 /tmp/llama-build.log
if [[ -f $WORK/oss2.gguf && $(left) -gt 120 ]]; then
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
timeout 200 $B/nuvec bench --model $WORK/oss2.gguf --device cuda -p 32 -g 16 -n 1 2>&1 | grep -oE 'generation_tps=[0-9.]*'
NUVEC_CUDA_GRAPHS=0 timeout $(( $(left) - 20 )) $NCU --metrics gpu__time_duration.sum --csv -c 700 $B/nuvec bench --model $WORK/oss2.gguf --device cuda -p 32 -g 16 -n 1 > $OUT/raw/ncu-oss2.csv 2> $OUT/raw/ncu-oss2.err
python3 - $OUT/raw/ncu-oss2.csv <<'PY'
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
tail -3 $OUT/raw/ncu-oss2.err
fi
echo "left $(left) s"; echo done
