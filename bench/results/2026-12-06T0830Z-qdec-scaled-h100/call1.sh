#!/bin/bash
# Session 47, call 1: the bf16 register kernels for 4-bit weights with f16 / f32 scales (GGUF's
# Q4_0 and K-quants; NUVEC_QDEC_SCALED_FROM). Kernel cache check (NVRTC time on this host, a test
# binary run twice, the entries), registers and spills of qimma.cu (nvcc -Xptxas -v), the GPU
# tests, then the 8B Q4_0 GGUF's batched decode with the new rule against the old one (65: never)
# and against it from 2 rows, alternated.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-570} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok /tmp/fx && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
SRC=$(bench/llama-cpp source)
(PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/l8b.part --arch llama-3.1-8b --tokenizer /tmp/tok/llama3_1 > /tmp/gguf.log 2>&1 && mv $WORK/l8b.part $WORK/l8b.gguf) &
export NUVEC_GPU_FIXTURES=/tmp/fx
echo "== nvrtc on this host (left $(left) s)"; timeout 120 python3 bench/cuda/nvrtc_time.py crates/nuvec/src/backends/cuda/kernels 2>&1 | tail -6
t() { local s=$1; shift; local s0=$(date +%s); echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "^test .*(FAIL|ok$)|test result|panicked|assert|FAIL|left:|right:|RESULT" | head -40); echo "   ($(( $(date +%s) - s0 )) s)"; }
t 150 ./cuda_bf16 --test-threads=2 batched_decode linear_quantized linear_many products_over
echo "kernel cache entries: $(ls ~/.cache/nuvec/cuda-kernels 2>/dev/null | wc -l)"
t 60 ./cuda_bf16 --test-threads=2 batched_decode
t 90 ./cuda_auto_precision --test-threads=2
t 120 ./gpu_parity_bf16 --test-threads=1 --nocapture q4_batched_decode_forced_bf16 gguf_kquants_prefill_auto
t 120 ./gpu_batch --test-threads=1 --nocapture gguf_kquants_twenty f16_caches_of_a_half_model
echo "kernel cache entries: $(ls ~/.cache/nuvec/cuda-kernels 2>/dev/null | wc -l)"
( H=crates/nuvec/src/backends/cuda/kernels; cat $H/common.cuh $H/linear.cu $H/qimma.cu > /tmp/qimma_all.cu
  timeout 100 nvcc -arch=sm_90 -std=c++17 -Xptxas -v -c /tmp/qimma_all.cu -o /tmp/q.o > $OUT/raw/ptxas.txt 2>&1
  grep -A3 -E "entry function '(qdec|qimma_b4_r)" $OUT/raw/ptxas.txt | grep -E "entry|registers|spill" | paste - - - | sed -E 's/ptxas info *: //g' | cut -c1-200 ) &
wait
echo "ggufs ready (left $(left) s)"; tail -n 2 /tmp/gguf.log
b() { local tag=$1 bb=$2; shift 2; local s0=$(date +%s)
  env "$@" timeout 90 $B/nuvec bench --model $WORK/l8b.gguf --device cuda -p 512 -g 128 -b $bb -n 1 > $OUT/raw/$tag-b$bb.log 2>&1
  echo "$tag B=$bb: $(grep -oE 'generation_tps=[0-9.]*' $OUT/raw/$tag-b$bb.log | tail -1) ($(( $(date +%s) - s0 )) s) $(grep -iE 'error|panick' $OUT/raw/$tag-b$bb.log | head -2)"; }
for r in 1 2; do
  for bb in 32 64 8 16; do
    [[ $(left) -lt 60 ]] && break 2
    b old-r$r $bb NUVEC_QDEC_SCALED_FROM=65
    b new-r$r $bb X=1
    [[ $bb -le 16 ]] && b all-r$r $bb NUVEC_QDEC_SCALED_FROM=2
  done
done
echo "left $(left) s"; echo done
