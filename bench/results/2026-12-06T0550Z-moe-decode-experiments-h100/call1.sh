#!/bin/bash
# Session 46, call 1: verify the block-wide routing choice and the fused split attention (written after the last GPU call).
cd "$(dirname "$0")/.."
T0=$(date +%s); left() { echo $((${BUDGET:-300} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok /tmp/fx && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
SRC=$(bench/llama-cpp source)
(PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/a.part --arch qwen3-30b-a3b --layers 12 --tokenizer /tmp/tok/qwen3 > /dev/null 2>&1 && mv $WORK/a.part $WORK/a3b12.gguf) &
(PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/o.part --arch gpt-oss-20b --layers 12 --tokenizer /tmp/tok/gptoss > /dev/null 2>&1 && mv $WORK/o.part $WORK/oss12.gguf) &
export NUVEC_GPU_FIXTURES=/tmp/fx
t() { local s=$1; shift; echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "^test .*(FAIL|ok$)|test result|panicked|assert|FAIL|left:|right:" | head -30); }
t 60 ./cuda_moe --test-threads=2 moe_route
t 60 ./gpu_parity --test-threads=1 --exact gguf_qwen3_moe_model gguf_gpt_oss_model
t 50 ./cuda_ops --test-threads=2 attention decode_fusions rope
wait
b() { local e=$1 m=$2 tag=$3; shift 3
  timeout 100 $B/$e bench --model $m --device cuda "$@" > $OUT/raw/$e-$tag.log 2>&1
  echo "$e $tag: $(grep -oE 'generation_tps=[0-9.]*' $OUT/raw/$e-$tag.log | tail -1) $(grep -oE 'decode [0-9.]* ms/token with graphs' $OUT/raw/$e-$tag.log) $(grep -iE 'error|panick' $OUT/raw/$e-$tag.log | head -2)"; }
for r in 1 2; do for m in a3b12 oss12; do for e in nuvec-main nuvec-prev nuvec; do [[ $(left) -lt 30 ]] && break 3; b $e $WORK/$m.gguf $m-r$r -p 512 -g 128 -n 1; done; done; done
echo "left $(left) s"; echo done
