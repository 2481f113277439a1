#!/bin/bash
# Device run 87: issue 26's constraint cost on the seeded random 8B (make-random-checkpoint.py
# --seed 0, so later calls see the same answers), run 86's new build, 2 rounds: batch 64, then
# batch 1.
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/n && tar -C /tmp/n -xJf .cuda-bin/fused.tar.xz ./nuvec
python3 scripts/make-random-checkpoint.py /tmp/m8b-s0 --shape 8b --tokenizer .dev/tok-llama3 --vocab 128256 --seed 0 >/dev/null 2>&1 || echo "make failed"
export DEVICE=cuda GEN=128 NUVEC_BIN=/tmp/n/nuvec
echo "== batch 64"; ROUNDS=2 BATCH=64 PROMPT=512 timeout 250 bench/compare-constrained /tmp/m8b-s0 2>&1 | tail -8
echo "== batch 1"; ROUNDS=2 timeout 200 bench/compare-constrained /tmp/m8b-s0 2>&1 | tail -8
echo done
