#!/bin/bash
# Device run 76: the final build (dense experts on moe_chunk_x / moe_dot, grouped from 8 rows):
# the MoE suites, and a B = 8 step of the 12-layer Qwen3-30B-A3B shape under the default.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && tar -C /tmp/n -xJf .cuda-bin/fin.tar.xz
python3 scripts/make-random-checkpoint.py /tmp/a3b --shape a3b --layers 12 --tokenizer $PWD/.gpu-fixtures/fin/tok >/tmp/mk1.log 2>&1 &
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/fin
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|differ" | head -20); }
echo "== cuda_moe"; t 120 ./cuda_moe --test-threads=1
echo "== cuda_graphs"; t 60 ./cuda_graphs --test-threads=1 moe
echo "== gpu_parity"; t 60 ./gpu_parity --test-threads=1 qwen3_moe gpt_oss_q4_model
echo "== gpu_batch"; t 120 ./gpu_batch --test-threads=1 moe
wait
for bb in 1 8; do echo "a3b B=$bb :: $(timeout 60 /tmp/n/nuvec bench --model /tmp/a3b --device cuda -p 128 -g 32 -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | tr '\n' ' ')"; done
echo done
