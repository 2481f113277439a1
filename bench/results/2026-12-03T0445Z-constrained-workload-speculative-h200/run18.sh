#!/bin/bash
# Device run 18 (run 17 with the speculative build): what a structured-output constraint costs on the GPU (issue 26): the random 8B with
# Llama 3.1's tokenizer (vocab 128256), batch 1 (nuvec generate) and 64 (the Batcher); then issue
# 24's workload with Poisson arrivals (rate 4/s) at 1 and 32 concurrent on the random 8B (vocab 32000).
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/spec.tar.xz
R=$PWD
(python3 scripts/make-random-checkpoint.py /tmp/m8b-l3 --shape 8b --tokenizer .dev/tok-llama3 --vocab 128256 >/dev/null 2>&1 || echo "make 8b-l3 failed") &
([ -f /tmp/m8b/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
wait
export NUVEC_BIN=/tmp/n/nuvec DEVICE=cuda GEN=128
ROUNDS=3 BATCH=1 timeout 200 bench/compare-constrained /tmp/m8b-l3 2>&1 | tail -9
ROUNDS=2 BATCH=64 PROMPT=512 timeout 200 bench/compare-constrained /tmp/m8b-l3 2>&1 | tail -14
timeout 180 python3 bench/compare_serve_workload.py --model /tmp/m8b --nuvec /tmp/n/nuvec --python python3 --vocab 32000 \
    --device cuda --concurrency 1 32 --rate 4 --rounds 1 --skip-mlx 2>&1 | grep -E "^C=|rror" | head -6
# Prompt lookup on the random 8B over a prompt that repeats (issue 27's GPU case).
P="$(python3 -c "print(' '.join(['the red fox runs past the old mill and the river bends toward the sea'] * 20))")"
for r in 1 2; do for f in "" "--prompt-lookup" "--prompt-lookup --num-draft-tokens 8"; do
  echo "round $r [$f] $(/tmp/n/nuvec generate --model /tmp/m8b --device cuda --prompt "$P" -m 200 --ignore-chat-template $f 2>&1 | grep -E '^Generation|^Speculative|rror' | tr '\n' ' ')"
done; done
echo done
