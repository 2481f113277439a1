#!/bin/bash
# Device run (twentieth session): issue 24's serving workload on the H200 through nuvec's Batcher
# alone (mlx-lm not carried): 1,024-token prompts, half after a shared 4,096-token prefix, 256
# generated, all submitted at once (rate 0: the Batcher's capacity), C = 1, 8, 32, 64 in flight,
# prefix cache on and off, on the random 8B (4-bit g64, bf16 scales; vocab 32,000).
cd "$(dirname "$0")/.."
mkdir -p /tmp/e && tar -C /tmp/e -xJf .cuda-bin/exp.tar.xz; E=/tmp/e
[ -d /tmp/m8b ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed"
timeout 540 python3 bench/compare_serve_workload.py --model /tmp/m8b --nuvec $E/nuvec --python python3 --vocab 32000 \
  --device cuda --concurrency ${CONC:-1 8 32 64} --rate ${RATE:-0} --rounds 1 --skip-mlx 2>&1 | tail -30
