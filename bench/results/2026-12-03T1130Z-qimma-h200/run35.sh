#!/bin/bash
# Device run 35: qimma with per-chunk scales (no group epilogue), 3-slot pipeline. gpu_batch and
# cuda_bf16's batched-decode test, the random 8B at B = 2..64 (off / on), then ncu stall reasons
# on the first qimma launches at B=32.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q5.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|gpu .* vs" | head -20); }
NUVEC_QIMMA=1 t 120 ./cuda_bf16 --test-threads=1 batched_decode linear_many
NUVEC_QIMMA=1 NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 100 ./gpu_batch --test-threads=1
wait
for b in 2 8 16 32 64; do for q in 0 1; do
  echo "B=$b qimma=$q $(NUVEC_QIMMA=$q timeout 60 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E 'Averages|rror|panick' | tr '\n' ' ')"
done; done
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|smsp__issue_active\.avg\.pct_of_peak_sustained_active|gpu__time_duration\.sum|smsp__warps_active\.avg\.per_cycle_active'
timeout 100 ncu --print-units base --metrics "$M" -k regex:qimma -c 2 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 100 -g 2 -b 32 -n 1 --no-warmup 2>&1 | grep -E "qimma|stalled|issue_active|warps_active|duration" | awk '$NF+0 > 0.05 || /qimma/' | head -40
echo done
