#!/bin/bash
# Device run 65: + batched norms spread over blocks (add_rms_norm_rows_f32). Tests; main (a), the
# producers' tiles alone (t), both (n) alternated at B = 1-64; ncu steps B = 8 / 64; workload 64.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c /tmp/t /tmp/n && tar -C /tmp/a -xJf .cuda-bin/base.tar.xz && tar -C /tmp/c -xJf .cuda-bin/new2.tar.xz
cp /tmp/c/nuvec /tmp/n/nuvec; cp /tmp/c/nuvec-tiles /tmp/t/nuvec
G=$PWD/.gpu-fixtures/core; T=$G/mistral-q4g64
([ -f /tmp/m8b/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer $T >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
python3 scripts/make-random-checkpoint.py $G/random-tiny-q4 --shape tiny --tokenizer $T >/dev/null 2>&1 || echo "make tiny failed"
t() { local s=$1; shift; (cd /tmp/c && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|error|differ|gpu_batch random|add_rms_norm m=(8|64)" | head -40); }
echo "== cuda_bf16"; t 240 ./cuda_bf16 --test-threads=1 --nocapture products_over linear_many paged_decode
echo "== cuda_ops"; t 200 ./cuda_ops --test-threads=1
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$G t 200 ./gpu_batch --test-threads=1 --nocapture
wait
b() { local bin=$1 bb=$2; echo "$bin B=$bb $(timeout 90 $bin/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for bb in 8 32 64 16 48 1; do b /tmp/a $bb; b /tmp/t $bb; b /tmp/n $bb; done
for bb in 8 32 64 48; do b /tmp/n $bb; b /tmp/t $bb; b /tmp/a $bb; done
echo done
