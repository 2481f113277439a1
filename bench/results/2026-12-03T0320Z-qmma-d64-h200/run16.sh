#!/bin/bash
# Device run 16: bf16 x for 2-8 rows (QM_BF16_FROM=2: the factored m16 kernel) and weights decoded
# in registers for 2-32 rows (QM_DEQ_FROM=2/9: qmma_b4_d16/d32) against the defaults (f32-accuracy
# split kernel for 2-8 rows, exact factored kernels for 9-32).
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/d16.tar.xz
[ -f /tmp/m8b/config.json ] || (python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/gb
t() { local bin=$1 lim=$2; shift 2; (cd /tmp/n && timeout $lim ./$bin --test-threads=1 "$@" 2>&1 | grep -E "^test |test result|panicked|left|right|differ|widest" | head -40); }
t cuda_bf16 200 batched_decode linear_many
t gpu_batch 200
echo "gpu_batch with bf16 x and decoded weights from 2 rows:"
NUVEC_NVRTC_DEFINES=QM_BF16_FROM=2,QM_DEQ_FROM=2 t gpu_batch 200 --nocapture dense_llama qwen3_batched
wait
run() { local tag=$1 defs=$2 b=$3 p=$4 g=$5; echo "$tag B=$b p=$p g=$g $(NUVEC_NVRTC_DEFINES=$defs /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p $p -g $g -b $b -n 1 --no-warmup 2>&1 | grep -E 'Averages|rror' | tail -1)"; }
for round in 1 2; do
  run f32 "" 8 512 128; run m16 QM_BF16_FROM=2 8 512 128; run d16 QM_BF16_FROM=2,QM_DEQ_FROM=2 8 512 128
  run m16 "" 16 512 128; run d16 QM_DEQ_FROM=9 16 512 128
done
run f32 "" 4 512 128; run m16 QM_BF16_FROM=2 4 512 128; run d16 QM_BF16_FROM=2,QM_DEQ_FROM=2 4 512 128
echo done
