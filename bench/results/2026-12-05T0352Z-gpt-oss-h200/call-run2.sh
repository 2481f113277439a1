#!/bin/bash
# Device call: windowed attention (flash with windows and sinks) and rotating caches in CUDA
# graphs (gpt-oss decode) tests; gpt-oss GGUF before/after and against llama.cpp; ncu.
cd "$(dirname "$0")/.."
T0=$(date +%s); left() { echo $((560 - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp -xJf .gpu-run/fx.tar.xz
mkdir -p /tmp/tok/gptoss && cp /tmp/fx/gpt_oss/gpt_oss-q4g64/tokenizer*.json /tmp/tok/gptoss/
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
export WORK=/tmp/gb; mkdir -p $WORK
SRC=$(bench/llama-cpp source)
(bench/llama-cpp build cuda llama-bench > /tmp/llama-build.log 2>&1; echo "build rc $?" >> /tmp/llama-build.log) &
(PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/gpt-oss-20b.gguf.part --arch gpt-oss-20b --tokenizer /tmp/tok/gptoss && mv $WORK/gpt-oss-20b.gguf.part $WORK/gpt-oss-20b.gguf) > /tmp/gguf.log 2>&1 &
export NUVEC_GPU_FIXTURES=/tmp/fx
t() { local s=$1; shift; (cd $B && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|FAIL|RESULT.*(window|gpt_oss|max_kv|steps)" | head -60); }
echo "== cuda_graphs"; t 150 ./cuda_graphs --test-threads=1 --nocapture gpt_oss rotating mistral generation
echo "== cuda_bf16"; t 90 ./cuda_bf16 --test-threads=1 --nocapture attention
echo "== cuda_hybrid_ops"; t 90 ./cuda_hybrid_ops --test-threads=1
echo "== cuda_graph"; t 90 ./cuda_graph --test-threads=1
echo "== gpu_parity"; t 150 ./gpu_parity --test-threads=1 gpt_oss rotating_cache_whole
echo "left $(left) s"; wait; tail -2 /tmp/llama-build.log /tmp/gguf.log
echo "== compare-gpu"
NUVEC=$B/nuvec ENGINES=llama MODELS=gpt-oss-20b ROUNDS=1 TRIALS=2 TOKENIZERS=/tmp/tok timeout $(left) bench/compare-gpu 2>&1 | tail -16
b() { local bin=$1; shift; echo "$bin $* :: $(timeout 100 $B/$bin bench --model $WORK/gpt-oss-20b.gguf --device cuda "$@" 2>&1 | grep -E 'Averages|CUDA graphs|rror|panick' | sed -e 's/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
echo "== base vs new, left $(left) s"
b nuvec-base -p 512 -g 128 -n 2; b nuvec -p 512 -g 128 -n 2
b nuvec -p 4096 -g 1 -n 2; b nuvec-base -p 4096 -g 1 -n 2
echo "== ncu, left $(left) s"
timeout $(( $(left) - 10 )) ncu --clock-control none --cache-control none --print-units base --csv --page raw --metrics gpu__time_duration.sum,launch__grid_size $B/nuvec bench --model $WORK/gpt-oss-20b.gguf --device cuda -p 512 -g 4 -n 1 --no-warmup > $OUT/ncu-oss.csv 2>/dev/null; echo "ncu rc $?"; xz -9 $OUT/ncu-oss.csv
echo done
