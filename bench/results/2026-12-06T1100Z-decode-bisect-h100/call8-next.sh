#!/bin/bash
# For the next session's first device call (not run): a build with qdec-xoff-wip.patch applied
# (`git apply`; x's input tiles as one pointer plus 32-bit offsets, so that the 64-row bf16
# register kernels stop spilling) as nuvec-xoff, against main's build (nuvec), alternated, on
# the 8B MLX shape at B = 1 / 32 / 64; cuda_bf16 of the patched build first. Build both here
# (CARGO_TARGET_DIR=~/.cache/nuvec/cuda-target), strip, tar them with cuda_bf16 into
# .gpu-run/bins.tar.xz, and carry [".gpu-run"] with fx.tar.xz (mistral-q4g64, for its tokenizer).
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-540} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; mkdir -p $B /tmp/fx $WORK $OUT && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 scripts/make-random-checkpoint.py $WORK/m8b --shape 8b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1; echo "mk rc $?" >> /tmp/mk.log) &
(cd $B && timeout 200 ./cuda_bf16 --test-threads=2 batched_decode 2>&1 | grep -E "test result|panicked|FAIL" | head)
while ! grep -q "mk rc" /tmp/mk.log && [[ $(left) -gt 200 ]]; do sleep 3; done; tail -2 /tmp/mk.log
b() { local tag=$1 e=$2; local s0=$(date +%s)
  timeout 120 $B/$e bench --model $WORK/m8b --device cuda -p 512 -g 128 -b 1,32,64 -n 1 > $OUT/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -oE 'batch_size=[0-9]+|generation_tps=[0-9.]*' $OUT/$tag.log | paste -sd' ' | sed -E 's/batch_size=//g;s/generation_tps=/=/g')"; }
for r in 1 2; do [[ $(left) -lt 60 ]] && break; b main-r$r nuvec; [[ $(left) -lt 60 ]] && break; b xoff-r$r nuvec-xoff; done
echo "left $(left) s"; echo done
