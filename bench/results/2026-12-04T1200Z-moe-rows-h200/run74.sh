#!/bin/bash
# Device run 74: Gemma 4's MoE on the new rows kernels; where the gathered kernels stop paying
# against the grouped products (NUVEC_MOE_GATHER_ROWS) at 32-128 rows.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && tar -C /tmp/n -xJf .cuda-bin/new.tar.xz
T=$PWD/.gpu-fixtures/fin/tok
python3 scripts/make-random-checkpoint.py /tmp/a3b --shape a3b --layers 12 --tokenizer $T >/tmp/mk1.log 2>&1 &
python3 scripts/make-random-checkpoint.py /tmp/oss --shape gpt-oss-20b --layers 12 --tokenizer $T >/tmp/mk2.log 2>&1 &
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/fin
(cd /tmp/n && timeout 120 ./gpu_parity --test-threads=1 gemma4_moe 2>&1 | grep -E "^test |test result|panicked|widest" | head)
wait
b() { local g=$1 m=$2; shift 2; echo "gather<=$g $m $* :: $(NUVEC_MOE_GATHER_ROWS=$g timeout 120 /tmp/n/nuvec bench --model /tmp/$m --device cuda "$@" 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/peak_memory=[0-9.]*//;s/prompt_tps=[0-9.]*,//' | tr '\n' ' ')"; }
for m in a3b oss; do
  for bb in 16 32 64 96 128; do
    b 0 $m -p 128 -g 32 -b $bb -n 1; b 128 $m -p 128 -g 32 -b $bb -n 1
  done
done
echo done
