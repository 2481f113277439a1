#!/bin/bash
# Device call (this session): the MoE experts on int8 dot products. Tests (cuda_moe, gpu_parity's
# MoE cases), then 12-layer Qwen3-30B-A3B shapes, GGUF Q4_0 and mlx 4-bit g64, main's binary
# (nuvec-old) against this one (nuvec) alternated, and llama.cpp's llama-bench on the GGUF; then
# the 8B GGUF at B = 16/32/64, this binary against it plus wip-qmma-lg32 (nuvec-lg32).
cd "$(dirname "$0")/.."
T0=$(date +%s); left() { echo $((585 - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok /tmp/fx && tar -C $B -xJf .gpu-run/bins4.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok3.tar.xz && tar -C /tmp/fx -xf .gpu-run/fx4.tar
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
SRC=$(bench/llama-cpp source)
(bench/llama-cpp build cuda llama-bench llama-batched-bench > /tmp/llama-build.log 2>&1; echo "build rc $?" >> /tmp/llama-build.log) &
(PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/a3b.part --arch qwen3-30b-a3b --layers 12 --tokenizer /tmp/tok/qwen3 && mv $WORK/a3b.part $WORK/a3b12.gguf
 python3 scripts/make-random-checkpoint.py $WORK/a3b-mlx.part --shape a3b --layers 12 --tokenizer /tmp/tok/qwen3 && mv $WORK/a3b-mlx.part $WORK/a3b12-mlx
 PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/l8b.part --arch llama-3.1-8b --tokenizer /tmp/tok/llama3_1 && mv $WORK/l8b.part $WORK/l8b.gguf) > /tmp/gguf.log 2>&1 &
export NUVEC_GPU_FIXTURES=/tmp/fx
t() { local s=$1; shift; echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "^test .*(FAIL|ok$)|test result|panicked|assert|FAIL|max" | head -30); }
t 200 ./cuda_moe --test-threads=2
t 100 ./gpu_parity --test-threads=1 --exact qwen3_moe_q4_model rotating_cache_moe q4_model
echo "left $(left) s"; tail -n 2 /tmp/gguf.log; ls -la $WORK
b() { # engine model args... : one bench process, its tps lines
  local e=$1 m=$2 tag=$3; shift 3
  timeout 150 $B/$e bench --model $m --device cuda "$@" > $OUT/raw/$e-$tag.log 2>&1
  echo "$e $tag: $(grep -oE '(prompt|generation)_tps=[0-9.]*' $OUT/raw/$e-$tag.log | tr '\n' ' ') $(grep -iE 'error|panick' $OUT/raw/$e-$tag.log | head -2)"
}
while [[ ! -f $WORK/a3b12.gguf && $(left) -gt 200 ]]; do sleep 3; done
for r in 1 2; do for e in nuvec-old nuvec; do [[ $(left) -lt 150 ]] && break 2; b $e $WORK/a3b12.gguf a3b12-gguf-r$r -p 512 -g 128 -n 2; done; done
while [[ ! -d $WORK/a3b12-mlx && $(left) -gt 200 ]]; do sleep 3; done
for r in 1 2; do for e in nuvec-old nuvec; do [[ $(left) -lt 120 ]] && break 2; b $e $WORK/a3b12-mlx a3b12-mlx-r$r -p 512 -g 128 -n 2; done; done
tail -n 2 /tmp/llama-build.log
LBIN=$(bench/llama-cpp build cuda llama-bench 2>/dev/null) || true
echo "left $(left) s"
if [[ -x "$LBIN/llama-bench" && $(left) -gt 60 ]]; then
  timeout $(( $(left) - 20 )) $LBIN/llama-bench -m $WORK/a3b12.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 3 > $OUT/raw/llama-bench-a3b12.log 2>&1
  grep -E "^\|" $OUT/raw/llama-bench-a3b12.log | tail -3
fi
echo "left $(left) s"; tail -n 3 /tmp/gguf.log; echo done
