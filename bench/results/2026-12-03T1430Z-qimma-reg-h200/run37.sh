#!/bin/bash
# Device run 37: per-step tables copied once per step (upload_shared) against once per layer.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q7.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|gpu .* vs" | head -20); }
NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 150 ./gpu_batch --test-threads=1
wait
for b in 2 8 32 64; do for r in 1 2; do for s in share noshare; do
  if [ $s = noshare ]; then export NUVEC_DEV_NOSHARE=1; else unset NUVEC_DEV_NOSHARE; fi
  echo "B=$b $s $(NUVEC_HOSTPROF=1 timeout 60 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $b -n 1 2>&1 | grep -E 'Averages|rror|panick|hostprof' | sed -e 's/alloc_fresh.*//' -e 's/prompt_tps=[0-9.]*,//' | tail -2 | tr '\n' ' ')"
done; done; done
unset NUVEC_DEV_NOSHARE
echo done
