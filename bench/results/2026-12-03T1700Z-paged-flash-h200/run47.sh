#!/bin/bash
# Device run 47 (not run yet): branch qmma-xperm (x converted in the bf16 few-row kernels' order,
# no byte permutes in their loop) against main. Build both here: main's nuvec into
# .cuda-bin/main.tar.xz, the branch's nuvec, cuda_bf16, gpu_batch and gpu_parity_bf16 into
# .cuda-bin/xperm.tar.xz (stripped), carry
# [".cuda-bin", ".dev", ".gpu-fixtures/core"] with .dev/tok.tar.xz.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/b && tar -C /tmp/a -xJf .cuda-bin/main.tar.xz && tar -C /tmp/b -xJf .cuda-bin/xperm.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || tail -5 /tmp/mk.log) &
(cd /tmp/b && timeout 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized attention_prefill paged_decode 2>&1 | grep -E "^test |test result|panicked" | head)
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core
(cd /tmp/b && timeout 100 ./gpu_batch --test-threads=1 2>&1 | grep -E "test result|panicked")
(cd /tmp/b && timeout 100 ./gpu_parity_bf16 --test-threads=1 --nocapture q4_batched_decode 2>&1 | grep -E "RESULT|test result|panicked")
wait
for r in 1 2; do for bb in 24 32 48 64; do for bin in /tmp/a /tmp/b; do
  echo "r$r $bin B=$bb $(timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | tr '\n' ' ')"
done; done; done
