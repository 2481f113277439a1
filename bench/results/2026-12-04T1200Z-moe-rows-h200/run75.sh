#!/bin/bash
# Device run 75: batched MoE steps grouped from 16 rows (NUVEC_MOE_GROUPED_ROWS); the GPU suites
# that cover the grouped and gathered paths; where grouped starts to pay (8-24 rows).
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && tar -C /tmp/n -xJf .cuda-bin/grp.tar.xz
T=$PWD/.gpu-fixtures/fin/tok
python3 scripts/make-random-checkpoint.py /tmp/a3b --shape a3b --layers 12 --tokenizer $T >/tmp/mk1.log 2>&1 &
python3 scripts/make-random-checkpoint.py /tmp/oss --shape gpt-oss-20b --layers 12 --tokenizer $T >/tmp/mk2.log 2>&1 &
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/fin
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|differ|widest" | head -20); }
echo "== gpu_batch"; t 150 ./gpu_batch --test-threads=1 moe
echo "== cuda_graphs"; t 60 ./cuda_graphs --test-threads=1 moe
echo "== cuda_moe_grouped"; t 120 ./cuda_moe_grouped --test-threads=1
echo "== gpu_parity_bf16"; t 120 ./gpu_parity_bf16 --test-threads=1 moe_bf16
wait
b() { local g=$1 m=$2; shift 2; echo "grouped>=$g $m $* :: $(NUVEC_MOE_GROUPED_ROWS=$g timeout 100 /tmp/n/nuvec bench --model /tmp/$m --device cuda "$@" 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/peak_memory=[0-9.]*//;s/prompt_tps=[0-9.]*,//' | tr '\n' ' ')"; }
for m in a3b oss; do
  for bb in 8 12 16 24; do b 16 $m -p 128 -g 32 -b $bb -n 1; b 1000 $m -p 128 -g 32 -b $bb -n 1; done
  b 1 $m -p 128 -g 32 -b 8 -n 1; b 1 $m -p 128 -g 64 -b 1 -n 1
done
echo done
