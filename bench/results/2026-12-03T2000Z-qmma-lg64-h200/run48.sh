#!/bin/bash
# Device run 48: main (3ef8f7b) vs branch qmma-xperm rebased on it; tests of the branch (which holds
# main's unverified attention refactors); a whole-step ncu profile at B = 64.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/b && tar -C /tmp/a -xJf .cuda-bin/main.tar.xz && tar -C /tmp/b -xJf .cuda-bin/xperm.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/b && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|RESULT" | head -30); }
echo "== cuda_bf16"; t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many linear_quantized attention_prefill paged_decode
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core
echo "== gpu_batch"; t 100 ./gpu_batch --test-threads=1
echo "== gpu_parity_bf16"; t 100 ./gpu_parity_bf16 --test-threads=1 --nocapture q4_batched_decode
wait
b() { local bin=$1 bb=$2 p=$3 g=$4; echo "$bin B=$bb p=$p $(timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p $p -g $g -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//' | tr '\n' ' ')"; }
for r in 1 2; do for bb in 64 32; do for bin in /tmp/a /tmp/b; do b $bin $bb 512 64; done; done; done
for bb in 16 48; do for bin in /tmp/a /tmp/b; do b $bin $bb 512 64; done; done
for bin in /tmp/a /tmp/b; do b $bin 64 16 64; done
timeout 240 ncu --clock-control none --cache-control none --print-units base --csv --metrics gpu__time_duration.sum /tmp/a/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 3 -b 64 -n 1 --no-warmup > $OUT/ncu-step-b64.csv 2>/dev/null
echo "ncu rc=$?"; xz -9 $OUT/ncu-step-b64.csv
echo done
