#!/bin/bash
# Device run 13: the query heads of a KV group in one block of the paged decode kernel. Correctness
# (cuda_half_kv, cuda_ops' paged cases, gpu_batch), then the random 8B at 8b3b266 (old) and with
# the grouping (new) alternated, and issue 24's workload at 64 concurrent (new).
cd "$(dirname "$0")/.."
mkdir -p /tmp/o /tmp/n && tar -C /tmp/o -xJf .cuda-bin/kv.tar.xz ./nuvec && tar -C /tmp/n -xJf .cuda-bin/grp.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/gb
t() { local bin=$1 lim=$2; shift 2; (cd /tmp/n && timeout $lim ./$bin --test-threads=1 "$@" 2>&1 | grep -E "^test |test result|panicked|left|right|differ" | head -20); }
t cuda_half_kv 100
t cuda_ops 100 paged rope_and_paged attention
t gpu_batch 200
wait
run() { local v=$1 b=$2 p=$3 g=$4; echo "$v B=$b p=$p $(/tmp/$v/nuvec bench --model /tmp/m8b --device cuda -p $p -g $g -b $b -n 1 --no-warmup 2>&1 | grep -E 'Averages|rror' | tail -1)"; }
for round in 1 2; do run o 64 3072 32; run n 64 3072 32; run o 64 512 64; run n 64 512 64; done
run o 32 2048 32; run n 32 2048 32
timeout 150 python3 bench/compare_serve_workload.py --model /tmp/m8b --nuvec /tmp/n/nuvec --python python3 --vocab 32000 \
    --device cuda --concurrency 64 --rate 0 --rounds 1 --skip-mlx 2>&1 | grep -E "^C=" | head -2
echo done
