#!/bin/bash
# Device run 52: NVRTC sources compiled on a thread each (par) against one after another (lg2):
# wall time of a tiny bench (start-up dominated), after one warm-up each for the driver's cache.
cd "$(dirname "$0")/.."
mkdir -p /tmp/c /tmp/d && tar -C /tmp/c -xJf .cuda-bin/lg2.tar.xz && tar -C /tmp/d -xJf .cuda-bin/par.tar.xz
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core
(cd /tmp/d && timeout 100 ./gpu_batch --test-threads=1 2>&1 | grep -E "test result|panicked")
M=$PWD/.gpu-fixtures/core/mistral-q4g64
for bin in /tmp/c /tmp/d; do timeout 120 $bin/nuvec bench --model $M --device cuda -p 16 -g 4 -b 1 -n 1 >/dev/null 2>&1; done
for r in 1 2 3; do for bin in /tmp/c /tmp/d; do
  s=$(date +%s.%N); timeout 120 $bin/nuvec bench --model $M --device cuda -p 16 -g 4 -b 1 -n 1 2>&1 | grep -E "Averages|rror" | tr '\n' ' '; e=$(date +%s.%N)
  echo "$bin wall $(python3 -c "print(round($e-$s,2))") s"
done; done
echo done
