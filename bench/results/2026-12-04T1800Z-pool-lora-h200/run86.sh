#!/bin/bash
# Device run 86: the adapters' fused paths and add_linear (new: 59de8d5) against run 84's build
# (old: 64c7f42): gpu_adapters and cuda_ops' elementwise test on the new build; a rank-8 LoRA on
# every projection of the random 8B against no adapter, alternated; constrained batch 64 with the
# Batcher reading back only the rows it samples on the host (new) against the pool alone (old).
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/o /tmp/n && tar -C /tmp/o -xJf .cuda-bin/lora.tar.xz ./nuvec && tar -C /tmp/n -xJf .cuda-bin/fused.tar.xz
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core
echo "== gpu_adapters"; timeout 150 /tmp/n/gpu_adapters 2>&1 | tail -3
echo "== cuda_ops copies_and_elementwise"; timeout 120 /tmp/n/cuda_ops copies_and_elementwise 2>&1 | tail -3
[ -f /tmp/m8b-l3/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b-l3 --shape 8b --tokenizer .dev/tok-llama3 --vocab 128256 >/dev/null 2>&1 || echo "make 8b-l3 failed"
python3 bench/results/2026-12-04T1800Z-pool-lora-h200/make_adapter.py /tmp/ad8b
for r in 1 2; do
  for run in "n none" "n lora" "o lora"; do
    set -- $run; extra=""; [ $2 = lora ] && extra="--adapter-path /tmp/ad8b"
    echo "== bench $1 $2 round $r"; timeout 60 /tmp/$1/nuvec bench --model /tmp/m8b-l3 --device cuda -p 512 -g 128 $extra 2>&1 | grep -E "Averages|CUDA graphs"
  done
done
export DEVICE=cuda GEN=128
for b in /tmp/n /tmp/o /tmp/n; do echo "== $b constrained batch 64"; NUVEC_BIN=$b/nuvec ROUNDS=1 BATCH=64 PROMPT=512 timeout 100 bench/compare-constrained /tmp/m8b-l3 2>&1 | tail -3; done
echo done
