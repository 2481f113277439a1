#!/bin/bash
# Session 48, call 2: the one-launch split attention's merge reading the partials through L2
# loads (ld.global.cg) instead of volatile ones, against the two launches
# (NUVEC_ATTN_SPLIT_MERGE=0), on the 8B Q4_0 GGUF and Qwen3-0.6B's shape (Q4_0 GGUF), alternated;
# first the GPU tests of the renamed 4-bit GEMV kernels (_v6.._v17 -> _w*/_xw1/_i*), each forced
# shape included.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-575} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok /tmp/fx && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
export WORK=/tmp/gb; mkdir -p $WORK
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SRC=$(bench/llama-cpp source)
g() { PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/$1.part --arch $2 --tokenizer /tmp/tok/$3 && mv $WORK/$1.part $WORK/$1.gguf; }
(g l8b llama-3.1-8b llama3_1; g q06 qwen3-0.6b qwen3) > /tmp/gguf.log 2>&1 &
export NUVEC_GPU_FIXTURES=/tmp/fx
t() { local s=$1; shift; local s0=$(date +%s); echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "test result|panicked|FAIL|left:|right:|rror" | head -20); echo "   ($(( $(date +%s) - s0 )) s)"; }
t 150 ./cuda_ops --test-threads=2
for v in body w1 w2 w4 w8 xw1 i1 i2 i4; do t 60 env NUVEC_QGEMV_VARIANT=$v ./cuda_ops --test-threads=2 fused_quantized linear_quantized linear_many_bias producers_write linear_add_rms; done
t 90 ./cuda_graph --test-threads=2
t 200 ./gpu_parity --test-threads=1 q4_model q8_model f16_cache_chunked_prefill bf16_rotating_cache_chunked_prompt longer_prompt_chunked_prefill rotating_cache_whole_prompt rotating_cache_chunked_prompt gguf_qwen3_moe_model greedy_generation_on_device_q4
while [[ ! -f $WORK/q06.gguf && $(left) -gt 200 ]]; do sleep 3; done
echo "ggufs (left $(left) s): $(ls $WORK)"; grep -v separator /tmp/gguf.log | tail -2
b() { local tag=$1 m=$2; shift 2; local s0=$(date +%s)
  env "$@" timeout 100 $B/nuvec bench --model $WORK/$m.gguf --device cuda -p 512 -g 128 -n 2 > /tmp/$tag.log 2>&1
  echo "$tag: $(grep -oE 'generation_tps=[0-9.]*' /tmp/$tag.log | paste -sd' ') ($(( $(date +%s) - s0 )) s) $(grep -iE 'error|panick' /tmp/$tag.log | head -2)"; }
for r in 1 2; do for m in l8b q06; do [[ $(left) -lt 60 ]] && break 2; b $m-merge1 $m NUVEC_ATTN_SPLIT_MERGE=1; b $m-merge0 $m NUVEC_ATTN_SPLIT_MERGE=0; done; done
echo "left $(left) s"; echo done
