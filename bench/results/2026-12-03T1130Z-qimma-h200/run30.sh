#!/bin/bash
# Device run 30: the integer few-row products (kernels/qimma.cu): cuda_bf16's product tests,
# gpu_batch, gpu_parity_bf16's batched decode, then the random 8B at B = 1..64 with the integer
# kernels off (NUVEC_QIMMA=0, the bf16 qmma forms) and on, alternated.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q1.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|error" | head -40); }
t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_quantized linear_many
NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/bf16 t 200 ./gpu_parity_bf16 --test-threads=1 q4_batched_decode
t 200 ./gpu_batch --test-threads=1
wait
for r in 1 2; do for b in 1 2 4 8 16 32 64; do for q in 0 1; do
  echo "r$r B=$b qimma=$q $(NUVEC_QIMMA=$q timeout 60 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E 'Averages|rror|panick' | tr '\n' ' ')"
done; done; done
echo done
