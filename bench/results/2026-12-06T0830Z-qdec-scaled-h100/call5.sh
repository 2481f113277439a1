#!/bin/bash
# Session 47, call 5: the 8B Q4_0 GGUF's single-sequence decode, 6ff2624's build (2026-12-05:
# 394.8 tok/s on an H100 then) against this session's (366.8-370.6 in call 3), alternated on one
# machine: a regression since, or another machine?
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-300} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok.tar.xz
export WORK=/tmp/gb; mkdir -p $WORK
nvidia-smi --query-gpu=name --format=csv,noheader
SRC=$(bench/llama-cpp source)
PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/l8b.gguf --arch llama-3.1-8b --tokenizer /tmp/tok/llama3_1 2>&1 | grep -v separator
echo "gguf ready (left $(left) s)"
b() { local e=$1; local s0=$(date +%s)
  timeout 90 $B/$e bench --model $WORK/l8b.gguf --device cuda -p 512 -g 128 -n 2 > /tmp/$e.log 2>&1
  echo "$e: $(grep -oE 'generation_tps=[0-9.]*' /tmp/$e.log | paste -sd' ') ($(( $(date +%s) - s0 )) s) $(grep -iE 'error|panick' /tmp/$e.log | head -2)"; }
for r in 1 2; do for e in nuvec-old nuvec; do [[ $(left) -lt 45 ]] && break 2; b $e; done; done
echo "left $(left) s"; echo done
