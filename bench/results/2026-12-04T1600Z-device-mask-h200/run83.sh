#!/bin/bash
# Device run 83: run 82's batch-64 comparison again with compare-constrained reading the workload
# report past its new "Workload steps" line.
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/a /tmp/n && tar -C /tmp/a -xJf .cuda-bin/px4.tar.xz ./nuvec && tar -C /tmp/n -xJf .cuda-bin/mask.tar.xz ./nuvec
[ -f /tmp/m8b-l3/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b-l3 --shape 8b --tokenizer .dev/tok-llama3 --vocab 128256 >/dev/null 2>&1 || echo "make 8b-l3 failed"
export DEVICE=cuda GEN=128
for b in /tmp/n /tmp/a; do echo "== $b batch 64"; NUVEC_BIN=$b/nuvec ROUNDS=1 BATCH=64 PROMPT=512 timeout 100 bench/compare-constrained /tmp/m8b-l3 2>&1 | tail -7; done
echo done
