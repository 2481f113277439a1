#!/bin/bash
# Device call 3: the router and its choice in one launch. Tests (cuda_moe incl. linear_route,
# gpu_parity's MoE cases), greedy tokens of the mixed-format Qwen3-MoE GGUF fixture (f32 router)
# from both binaries, then the 12-layer A3B GGUF: the previous commit's binary (nuvec-prev)
# against this one (nuvec) alternated, and llama-bench on the same file.
cd "$(dirname "$0")/.."
T0=$(date +%s); left() { echo $((400 - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok /tmp/fx && tar -C $B -xJf .gpu-run/bins7.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok3.tar.xz && tar -C /tmp/fx -xf .gpu-run/fx6.tar
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
SRC=$(bench/llama-cpp source)
(PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/a3b.part --arch qwen3-30b-a3b --layers 12 --tokenizer /tmp/tok/qwen3 && mv $WORK/a3b.part $WORK/a3b12.gguf) > /tmp/gguf.log 2>&1 &
export NUVEC_GPU_FIXTURES=/tmp/fx
t() { local s=$1; shift; echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "^test .*(FAIL|ok$)|test result|panicked|assert|FAIL|left:|right:" | head -30); }
t 200 ./cuda_moe --test-threads=2 linear_route

for e in nuvec-prev nuvec; do
  echo "$e: $(timeout 120 $B/$e generate --model /tmp/fx/gguf-qwen3moe/model.gguf --device cuda --ignore-chat-template -p 'The capital of France is' -m 24 --temp 0 --ignore-eos 2>/dev/null | head -c 400 | tr '\n' ' ')"
done
echo "left $(left) s"
b() { local e=$1 m=$2 tag=$3; shift 3
  timeout 150 $B/$e bench --model $m --device cuda "$@" > $OUT/raw/$e-$tag.log 2>&1
  echo "$e $tag: $(grep -oE '(prompt|generation)_tps=[0-9.]*' $OUT/raw/$e-$tag.log | tr '\n' ' ') $(grep -iE 'error|panick' $OUT/raw/$e-$tag.log | head -2)"; }
while [[ ! -f $WORK/a3b12.gguf && $(left) -gt 120 ]]; do sleep 3; done
for r in 1 2; do for e in nuvec-prev nuvec; do [[ $(left) -lt 45 ]] && break 2; b $e $WORK/a3b12.gguf a3b12-gguf-r$r -p 512 -g 128 -n 2; done; done
echo "left $(left) s"; echo done
