#!/bin/bash
# Device run 72: the many-row gathered MoE kernels (moe_gate_up_rows / moe_down_rows). GPU suites
# that run them; base (main) vs new alternated on random 12-layer Qwen3-30B-A3B and gpt-oss-20b
# shapes; ncu of the MoE kernels in a B = 1 step.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/n && tar -C /tmp/a -xJf .cuda-bin/base.tar.xz && tar -C /tmp/n -xJf .cuda-bin/new.tar.xz
T=$PWD/.gpu-fixtures/moe/tok
python3 scripts/make-random-checkpoint.py /tmp/a3b --shape a3b --layers 12 --tokenizer $T >/tmp/mk1.log 2>&1 &
python3 scripts/make-random-checkpoint.py /tmp/oss --shape gpt-oss-20b --layers 12 --tokenizer $T >/tmp/mk2.log 2>&1 &
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/moe
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|differ|widest|steps" | head -40); }
echo "== cuda_moe"; t 120 ./cuda_moe --test-threads=1
echo "== cuda_graphs"; t 120 ./cuda_graphs --test-threads=1 moe
echo "== gpu_parity"; t 240 ./gpu_parity --test-threads=1 qwen3_moe rotating_cache_moe gpt_oss_q4_model gpt_oss_chunked_prompt gpt_oss_bf16_cache nvfp4_global_scale_moe
echo "== gpu_batch"; t 120 ./gpu_batch --test-threads=1 moe
wait
b() { local bin=$1 m=$2; shift 2; echo "$bin $m $* :: $(timeout 120 $bin/nuvec bench --model /tmp/$m --device cuda "$@" 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for r in 1 2; do
  for m in a3b oss; do
    b /tmp/a $m -p 512 -g 128 -n 1; b /tmp/n $m -p 512 -g 128 -n 1
    b /tmp/n $m -p 128 -g 32 -b 8 -n 1; b /tmp/a $m -p 128 -g 32 -b 8 -n 1
  done
done
for m in a3b oss; do b /tmp/a $m -p 128 -g 32 -b 64 -n 1; b /tmp/n $m -p 128 -g 32 -b 64 -n 1; done
for m in a3b oss; do
timeout 150 ncu --clock-control none --cache-control none --print-units base --csv --page raw --metrics gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread -k regex:moe_ /tmp/n/nuvec bench --model /tmp/$m --device cuda -p 16 -g 3 -n 1 --no-warmup > $OUT/ncu-moe-$m-b1.csv 2>/dev/null; xz -9 $OUT/ncu-moe-$m-b1.csv
done
echo done
