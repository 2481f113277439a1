#!/bin/bash
# Device run 69: what a structured-output constraint costs at batch 64 on the GPU (issue 26) since
# 97c3d3f (the Batcher samples the rows that need the host on threads): the random 8B with Llama
# 3.1's tokenizer (vocab 128256), the final build of this session.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && tar -C /tmp/n -xJf .cuda-bin/fin.tar.xz ./nuvec
python3 scripts/make-random-checkpoint.py /tmp/m8b-l3 --shape 8b --tokenizer .dev/tok-llama3 --vocab 128256 >/dev/null 2>&1 || echo "make 8b-l3 failed"
export NUVEC_BIN=/tmp/n/nuvec DEVICE=cuda GEN=128
ROUNDS=2 BATCH=64 PROMPT=512 timeout 300 bench/compare-constrained /tmp/m8b-l3 2>&1 | tail -14
ROUNDS=1 BATCH=1 timeout 100 bench/compare-constrained /tmp/m8b-l3 2>&1 | tail -8
echo done
