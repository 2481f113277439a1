#!/bin/bash
# Device run 36: verify the landed qimma (v4) and 6ac2fec on the GPU; host-time profile of batched decode.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q6.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|gpu .* vs" | head -20); }
for q in 0 1; do
  echo "== NUVEC_QIMMA=$q"
  NUVEC_QIMMA=$q t 120 ./cuda_bf16 --test-threads=1
  NUVEC_QIMMA=$q NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
done
wait
for b in 2 8 32 64; do for q in 0 1; do
  echo "B=$b qimma=$q $(NUVEC_HOSTPROF=1 NUVEC_QIMMA=$q timeout 60 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $b -n 1 2>&1 | grep -E 'Averages|rror|panick|hostprof' | tr '\n' ' ')"
done; done
echo "B=1 $(timeout 60 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -n 1 2>&1 | grep -E 'Averages|rror|panick' | tr '\n' ' ')"
echo done
