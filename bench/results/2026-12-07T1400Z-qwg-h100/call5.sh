#!/bin/bash
# Session 49, call 5: the committed build (db0687d: the batch copies as one helper, PTX otherwise
# unchanged) checked on the device: cuda_bf16's 20,000-row batched products (qwg under the default), gpu_batch's bf16-scaled
# batches under the default, then the 8B MLX shape at B = 32 / 64, the
# default against NUVEC_QDEC_WGMMA=0, once each as time allows.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-240} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; G=/tmp/gf; mkdir -p $B /tmp/fx $WORK $G $OUT/raw && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 scripts/make-random-checkpoint.py $WORK/m8b --shape 8b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1; echo "mk rc $?" >> /tmp/mk.log) &
python3 scripts/make-random-checkpoint.py $G/random-tiny-q4 --shape tiny --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mkt.log 2>&1 || tail -3 /tmp/mkt.log
(cd $B && timeout 100 ./cuda_bf16 --test-threads=2 batched_decode_products_of_many_tiles 2>&1 | tee $OUT/raw/cuda_bf16.log | grep -E "test result|panicked|differ" | head -5)
for mode in unset; do
  (cd $B && env $([[ $mode == 1 ]] && echo NUVEC_QDEC_WGMMA=1 || echo X=1) NUVEC_GPU_FIXTURES=$G timeout 100 ./gpu_batch --test-threads=1 --nocapture bf16_scaled 2>&1 | tee $OUT/raw/gpu_batch-$mode.log | grep -E "RESULT|test result|panicked|differ|another" | head -5)
done
while ! grep -q "mk rc" /tmp/mk.log && [[ $(left) -gt 30 ]]; do sleep 3; done; tail -1 /tmp/mk.log
b() { local tag=$1; shift; local s0=$(date +%s)
  env "$@" timeout 60 $B/nuvec bench --model $WORK/m8b --device cuda -p 512 -g 128 -b 32,64 -n 1 > $OUT/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -oE 'batch_size=[0-9]+|generation_tps=[0-9.]*' $OUT/$tag.log | paste -sd' ' | sed -E 's/batch_size=//g;s/generation_tps=/=/g')"; }
[[ $(left) -gt 25 ]] && b default X=1; [[ $(left) -gt 25 ]] && b wg0 NUVEC_QDEC_WGMMA=0
echo "left $(left) s"; echo done
