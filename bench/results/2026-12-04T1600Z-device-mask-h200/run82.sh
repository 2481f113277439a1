#!/bin/bash
# Device run 82: a structured-output constraint's mask applied where the logits are (mask_rows,
# then argmax_gap) for greedy rows, alone and in the Batcher (issue 26): cuda_ops' decode_fusions
# (mask_rows bit for bit against the CPU); bench/compare-constrained at batch 64 and 1 on the
# random 8B with Llama 3.1's tokenizer (vocab 128256), new build (mask) against the one before
# (px4, run 81's final build), alternated.
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/a /tmp/n && tar -C /tmp/a -xJf .cuda-bin/px4.tar.xz ./nuvec && tar -C /tmp/n -xJf .cuda-bin/mask.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b-l3 --shape 8b --tokenizer .dev/tok-llama3 --vocab 128256 >/dev/null 2>&1 || echo "make 8b-l3 failed") &
echo "== cuda_ops"; (cd /tmp/n && timeout 120 ./cuda_ops --test-threads=1 --nocapture decode_fusions 2>&1 | grep -E "^test |test result|panicked|mask_rows|argmax" | head -20)
wait
export DEVICE=cuda GEN=128
for b in /tmp/n /tmp/a; do echo "== $b batch 64"; NUVEC_BIN=$b/nuvec ROUNDS=1 BATCH=64 PROMPT=512 timeout 150 bench/compare-constrained /tmp/m8b-l3 2>&1 | tail -7; done
for b in /tmp/n /tmp/a; do echo "== $b batch 1"; NUVEC_BIN=$b/nuvec ROUNDS=1 BATCH=1 timeout 100 bench/compare-constrained /tmp/m8b-l3 2>&1 | tail -7; done
echo done
