#!/bin/bash
# Device run 55: B = 8 / 16 with the tensor-core paged decode (NUVEC_ATTS_BATCH_BLOCKS lowered so
# that a step of 8 or 16 sequences takes one common chunk of keys) against the solo splits;
# ring2 (the cp.async ring) against lg2 again.
cd "$(dirname "$0")/.."
mkdir -p /tmp/a /tmp/c && tar -C /tmp/a -xJf .cuda-bin/lg2.tar.xz && tar -C /tmp/c -xJf .cuda-bin/ring2.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }
b() { local bin=$1 e=$2 bb=$3 p=${4:-512} g=${5:-64}; echo "$bin $e B=$bb p=$p $(env $e timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p $p -g $g -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//;s/peak_memory=[0-9.]*//' | tr '\n' ' ')"; }
for r in 1 2; do for bb in 8 16; do
  b /tmp/a X=0 $bb; b /tmp/c X=0 $bb; b /tmp/c NUVEC_ATTS_BATCH_BLOCKS=512 $bb; b /tmp/c NUVEC_ATTS_BATCH_BLOCKS=256 $bb
done; done
for bb in 8 16; do b /tmp/c X=0 $bb 2048 32; b /tmp/c NUVEC_ATTS_BATCH_BLOCKS=512 $bb 2048 32; b /tmp/c NUVEC_ATTS_BATCH_BLOCKS=256 $bb 2048 32; done
for bb in 32 64; do b /tmp/c X=0 $bb; b /tmp/c NUVEC_ATTS_BATCH_BLOCKS=1024 $bb; done
echo done
