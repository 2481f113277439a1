#!/bin/bash
# The second call (call.sh's first ran on an H100: see README.md here). bins16: call.sh's bins15 with
# gpu_batch rebuilt from main (its quantized case over random-small-q4: the f32 fixtures' heads
# of 16 take no MLX group size, which failed it in call.sh). Carry: .gpu-run/{bins16,fx}.tar.xz.
# gpu_batch's quantized case; then gpt-oss-20b's shape cut to 4 layers (its own vocabulary: a cut
# one left its end-of-sequence id outside), `nuvec bench -b 1,8,32,64` with 267c280's binary and
# this one alternated, two rounds; then `nuvec generate --kv-bits 8` (the unpaged quantized
# cache: on the host in 267c280, on the device now) on the 8B shape cut to 8 layers, both ways,
# alternated.
cd "$(dirname "$0")/../../.."
B=/tmp/b; G=/tmp/gfx; mkdir -p $B /tmp/fx $G $OUT/raw
tar -C $B -xJf .gpu-run/bins16.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export NUVEC_GPU_FIXTURES=$G
python3 scripts/make-random-checkpoint.py $G/random-small-q4 --shape small --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk-small.log 2>&1; echo "mk small rc $?"
(cd $B && timeout 120 ./gpu_batch --test-threads=1 --nocapture --exact quantized_paged_caches_on_the_gpu > $OUT/raw/gpu_batch-quantized.log 2>&1; echo "gpu_batch quantized rc $?")
grep -E "test result|panicked|RESULT|called" $OUT/raw/gpu_batch-quantized.log | head -12
python3 scripts/make-random-checkpoint.py /tmp/oss --shape gpt-oss-20b --layers 4 --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk-oss.log 2>&1; echo "mk oss rc $?"
python3 scripts/make-random-checkpoint.py /tmp/r8 --shape 8b --layers 8 --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk-8b.log 2>&1; echo "mk 8b rc $?"
for round in 1 2; do
  for bin in nuvec-267c280 nuvec; do
    timeout 100 $B/$bin bench --model /tmp/oss --device cuda -p 512 -g 64 -b 1,8,32,64 -n 1 > $OUT/raw/bench-oss-$bin-r$round.log 2>&1
    echo "bench oss $bin round $round rc $?"; grep -oE "batch_size=[0-9]+|generation_tps=[0-9.]+|error.*" $OUT/raw/bench-oss-$bin-r$round.log | uniq | paste -sd' ' | head -c 400; echo
  done
done
P="$(python3 -c 'print("the quick brown fox jumps over the lazy dog " * 60)')"
for round in 1 2; do
  for bin in nuvec-267c280 nuvec; do
    timeout 60 $B/$bin generate --model /tmp/r8 --device cuda --kv-bits 8 --quantized-kv-start 0 --prompt "$P" -m 128 --ignore-eos > $OUT/raw/generate-kv8-$bin-r$round.log 2>&1
    echo "generate kv8 $bin round $round rc $? $(grep -E 'Generation:|error' $OUT/raw/generate-kv8-$bin-r$round.log | head -2)"
  done
done
echo done
