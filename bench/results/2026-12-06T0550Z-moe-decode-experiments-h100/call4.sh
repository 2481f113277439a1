#!/bin/bash
# Session 46, call 4: the integer MoE down kernel with a thread per (slot, chunk) pair where up to 8 warps hold them (A3B: 6 warps, one round of loads a thread), nuvec, against base (693a08b).
cd "$(dirname "$0")/.."
T0=$(date +%s); left() { echo $((${BUDGET:-300} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok /tmp/fx && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
SRC=$(bench/llama-cpp source)
g() { (PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/$1.part --arch $2 --layers $3 --tokenizer /tmp/tok/$4 > /dev/null 2>&1 && mv $WORK/$1.part $WORK/$1.gguf) & }
g a3b12 qwen3-30b-a3b 12 qwen3; g oss12 gpt-oss-20b 12 gptoss
export NUVEC_GPU_FIXTURES=/tmp/fx
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local s=$1; shift; echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "^test .*(FAIL|ok$)|test result|panicked|assert|FAIL|left:|right:|MISMATCH" | head -30); }
t 120 ./cuda_moe --test-threads=2 moe_experts
t 60 ./gpu_parity --test-threads=1 --exact gguf_qwen3_moe_model gguf_gpt_oss_model
wait; echo "ggufs ready (left $(left) s)"
b() { local e=$1 m=$2 tag=$3; shift 3; local s0=$(date +%s)
  timeout 100 $B/$e bench --model $m --device cuda "$@" > $OUT/raw/$e-$tag.log 2>&1
  echo "$e $tag: $(grep -oE 'generation_tps=[0-9.]*' $OUT/raw/$e-$tag.log | tail -1) $(grep -oE 'decode [0-9.]* ms/token with graphs' $OUT/raw/$e-$tag.log) ($(( $(date +%s) - s0 )) s) $(grep -iE 'error|panick' $OUT/raw/$e-$tag.log | head -2)"; }
for rm in 1:a3b12 1:oss12 2:a3b12 2:oss12 3:a3b12; do r=${rm%%:*}; m=${rm#*:}; for e in nuvec-base nuvec; do [[ $(left) -lt 35 ]] && break 3; b $e $WORK/$m.gguf $m-r$r -p 512 -g 128 -n 1; done; done
echo "left $(left) s"; echo done
