#!/bin/bash
# Device run 15: qmma_bN_d64 (weights decoded to bf16 in registers for 33-64 rows) against the
# cuBLAS route (QM_DEQ_FROM=1000 turns the new kernels off in the same binary); d32 against the
# exact m32 at 32 rows; more rows per call through the d64 kernel (QM_DEQ_MAX) for B=128 and prefill.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && tar -C /tmp/n -xJf .cuda-bin/deq.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/gb
t() { local bin=$1 lim=$2; shift 2; (cd /tmp/n && timeout $lim ./$bin --test-threads=1 "$@" 2>&1 | grep -E "^test |test result|panicked|left|right|differ|RESULT q4 g64|exceeds" | head -40); }
t cuda_bf16 200 --nocapture batched_decode linear_quantized linear_many
t gpu_batch 200
wait
run() { local tag=$1 defs=$2 b=$3 p=$4 g=$5; echo "$tag B=$b p=$p g=$g $(NUVEC_NVRTC_DEFINES=$defs /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p $p -g $g -b $b -n 1 --no-warmup 2>&1 | grep -E 'Averages|rror' | tail -1)"; }
OLD=QM_DEQ_FROM=1000
for round in 1 2; do
  run old $OLD 64 512 64; run new "" 64 512 64; run s2b3 QM_STAGES=2,QM_DEQ_MIN_BLOCKS=3 64 512 64
  run old $OLD 48 512 64; run new "" 48 512 64
  run m32 "" 32 512 64; run d32 QM_DEQ_FROM=17 32 512 64
done
run old $OLD 128 512 32; run d128 QM_DEQ_MAX=128 128 512 32
run old $OLD 1 512 4; run d512 QM_DEQ_MAX=512 1 512 4
run old $OLD 1 2048 4; run d2048 QM_DEQ_MAX=2048 1 2048 4
echo done
