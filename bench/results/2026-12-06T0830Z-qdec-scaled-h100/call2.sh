#!/bin/bash
# Session 47, call 2: the bf16 register kernels' `s` forms (f16 / f32 scales) from 9 rows. GPU
# tests; then the 8B shape as Q4_0 and as Q4_K GGUFs (bench/make_gguf_random.py --matrices),
# nuvec bench -b 1,8,16,32,64 with the old rule (NUVEC_QDEC_SCALED_FROM=65: never) and the new,
# alternated, and llama.cpp's llama-batched-bench on the same files between the nuvec rounds.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-575} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok /tmp/fx && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
export WORK=/tmp/gb; mkdir -p $WORK; R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
SRC=$(bench/llama-cpp source)
(bench/llama-cpp build cuda llama-batched-bench > /tmp/llama-build.log 2>&1; echo "build rc $?" >> /tmp/llama-build.log) &
g() { PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/$1.part --arch llama-3.1-8b --tokenizer /tmp/tok/llama3_1 --matrices $2 && mv $WORK/$1.part $WORK/$1.gguf; }
(g l8b q4_0; g l8k q4_k) > /tmp/gguf.log 2>&1 &
python3 scripts/make-random-checkpoint.py /tmp/fx/random-small-q4 --shape small > /dev/null 2>&1
python3 scripts/make-random-checkpoint.py /tmp/fx/random-tiny-q4 --shape tiny > /dev/null 2>&1
export NUVEC_GPU_FIXTURES=/tmp/fx
t() { local s=$1; shift; local s0=$(date +%s); echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "^test .*(FAIL|ok$)|test result|panicked|assert|FAIL|left:|right:|RESULT|rror" | head -40); echo "   ($(( $(date +%s) - s0 )) s)"; }
t 150 ./cuda_bf16 --test-threads=2 batched_decode linear_quantized linear_many products_over
t 60 ./cuda_auto_precision --test-threads=2
t 60 ./gpu_parity_bf16 --test-threads=1 --nocapture q4_batched_decode_forced_bf16
t 120 ./gpu_batch --test-threads=1 --nocapture gguf_kquants_twenty f16_caches_of_a_half_model bf16_scaled_4bit
while [[ ! -f $WORK/l8k.gguf && $(left) -gt 300 ]]; do sleep 3; done
echo "ggufs (left $(left) s): $(ls $WORK)"; grep -v separator /tmp/gguf.log | tail -2
b() { local tag=$1 m=$2; shift 2; local s0=$(date +%s)
  env "$@" timeout 120 $B/nuvec bench --model $WORK/$m.gguf --device cuda -p 512 -g 128 -b 1,8,16,32,64 -n 1 > $R/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -oE 'batch_size=[0-9]+|generation_tps=[0-9.]*' $R/$tag.log | paste -sd' ' | sed -E 's/batch_size=//g;s/generation_tps=/=/g') $(grep -iE 'error|panick' $R/$tag.log | head -2)"; }
lb() { local m=$1; LBIN=$(bench/llama-cpp build cuda llama-batched-bench 2>/dev/null) || { echo "no llama build"; tail -3 /tmp/llama-build.log; return; }
  timeout 150 $LBIN/llama-batched-bench -m $WORK/$m.gguf -ngl 99 -fa on -npp 512 -ntg 128 -npl 1,8,16,32,64 -c 45000 > $R/llama-$m.log 2>&1
  echo "llama $m: $(grep -E '^\|' $R/llama-$m.log | awk -F'|' 'NR>2 {printf "%s=%s ", $4+0, $9+0}')"; }
for m in l8b l8k; do b old-$m-r1 $m NUVEC_QDEC_SCALED_FROM=65; b new-$m-r1 $m X=1; done
while ! grep -q "build rc" /tmp/llama-build.log && [[ $(left) -gt 200 ]]; do sleep 3; done; tail -n 1 /tmp/llama-build.log
for m in l8b l8k; do [[ $(left) -lt 100 ]] && break; lb $m; done
for m in l8b l8k; do [[ $(left) -lt 50 ]] && break; b new-$m-r2 $m X=1; [[ $(left) -lt 50 ]] && break; b old-$m-r2 $m NUVEC_QDEC_SCALED_FROM=65; done
echo "left $(left) s"; echo done
