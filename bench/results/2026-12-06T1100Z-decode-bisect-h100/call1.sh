#!/bin/bash
# Session 48, call 1: where the 8B Q4_0 GGUF's single-sequence decode lost 7 % since 6ff2624
# (401.5-402.7 against 374.3-376.3 tok/s, H100, session 47). main (d23f5e6) with the fused
# attention merge on and off (NUVEC_ATTN_SPLIT_MERGE), then builds of 5d47d55 (before 7f81083),
# f1f0838 (before fd237b9) and 037ef60 (before 0258c51), one process each (they predate the
# kernel cache: each compiles its kernels first). Then cuda_auto_precision.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-570} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok.tar.xz
export WORK=/tmp/gb; mkdir -p $WORK
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SRC=$(bench/llama-cpp source)
PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/l8b.gguf --arch llama-3.1-8b --tokenizer /tmp/tok/llama3_1 2>&1 | grep -v separator | tail -1
echo "gguf ready (left $(left) s)"
b() { local tag=$1 e=$2; shift 2; local s0=$(date +%s)
  env "$@" timeout 150 $B/$e bench --model $WORK/l8b.gguf --device cuda -p 512 -g 128 -n 2 > /tmp/$tag.log 2>&1
  echo "$tag: $(grep -oE 'generation_tps=[0-9.]*' /tmp/$tag.log | paste -sd' ') ($(( $(date +%s) - s0 )) s) $(grep -iE 'error|panick' /tmp/$tag.log | head -2)"; }
b main-merge1-w nuvec NUVEC_ATTN_SPLIT_MERGE=1
for r in 1 2; do b main-merge1 nuvec NUVEC_ATTN_SPLIT_MERGE=1; b main-merge0 nuvec NUVEC_ATTN_SPLIT_MERGE=0; done
for c in 5d47d55 f1f0838 037ef60; do [[ $(left) -lt 110 ]] && break; b $c nuvec-$c X=1; done
[[ $(left) -gt 40 ]] && b main-merge1-end nuvec NUVEC_ATTN_SPLIT_MERGE=1
echo "== cuda_auto_precision (left $(left) s)"; (cd $B && timeout 60 ./cuda_auto_precision --test-threads=2 2>&1 | grep -E "test result|FAIL|panicked" | head)
echo "left $(left) s"; echo done
