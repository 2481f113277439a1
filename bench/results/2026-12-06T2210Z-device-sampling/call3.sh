#!/bin/bash
# Session 52, call 3 (the device time left: about 100 s of it): read_later's fix and the staged
# uploads under the Batcher's tests, and generate's draw on the device against the host's.
cd "$(dirname "$0")/../../.."
B=/tmp/b; G=/tmp/gfx; mkdir -p $B $G $OUT/raw
tar -C $B -xJf .gpu-run/bins6.tar.xz && tar -C $G -xJf .gpu-run/gfx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd $B && timeout 60 ./cuda_ops --test-threads=1 embed_spliced 2>&1 | tee $OUT/raw/cuda_ops.log | grep -E "^test |test result|panicked" | head -4)
(cd $B && NUVEC_STAGED_UPLOADS=1 NUVEC_GPU_FIXTURES=$G timeout 90 ./gpu_batch --test-threads=1 --nocapture the_batcher_serves 2>&1 | tee $OUT/raw/gpu_batch.log | grep -E "RESULT|test result|panicked|left|right" | head -14)
for ds in 0 1; do
  NUVEC_DEVICE_SAMPLING=$ds timeout 30 $B/nuvec generate --model $G/mistral-q4g64 --device cuda --prompt "Once upon a time" -m 48 --temp 1.0 --seed 3 --ignore-eos > $OUT/raw/gen-$ds.txt 2> $OUT/raw/gen-$ds.err
  echo "generate NUVEC_DEVICE_SAMPLING=$ds: rc $? $(md5sum < $OUT/raw/gen-$ds.txt | cut -c1-12) $(grep -iE 'generation|rror' $OUT/raw/gen-$ds.err | tr '\n' ' ')"
done
cmp -s $OUT/raw/gen-0.txt $OUT/raw/gen-1.txt && echo "generate: the same text both ways" || echo "generate: the texts differ"
echo done
