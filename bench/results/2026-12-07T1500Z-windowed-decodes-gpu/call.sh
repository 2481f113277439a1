#!/bin/bash
# bins15: built from main (the windowed decodes, 044be06, and the device-side unpaged quantized
# KV cache, 28fb841) with --features cuda: nuvec, cuda_ops, cuda_bf16, gpu_batch; and
# nuvec-267c280 (main before both) for the side-by-side. Carry: .gpu-run/{bins15,fx,gb}.tar.xz
# (gb: the mistral-q4g64, qwen3-q4g64, gpt_oss-q4g64 and qwen3_5-q4g64 fixtures, each with
# mistral's tokenizer (the tests' prompts are random ids) and no oracle files; the qwen3_moe
# cases are skipped for want of room in the carry).
# PART=tests: cuda_ops whole (the paged decode from a first key per sequence: windows of 128
# and 40 bit for bit each sequence's own windowed decode; the quantized stores), cuda_bf16's
# two paged tensor-core cases (windows of 128 within the bound), gpu_batch but its qwen3_moe
# cases (windowed_and_gated_layers_batched_on_the_gpu: gpt-oss past its window and Qwen3.5's
# gated layers, batched against alone; quantized_paged_caches_on_the_gpu).
# PART=bench: gpt-oss-20b's shape cut to 4 layers (two window layers of 128, vocab 32000) and
# the 8B shape cut to 8 layers, `nuvec bench -b 1,8,32,64` with 267c280's binary and this one
# alternated, two rounds; then the 8B cut at -b 1 with --kv-bits 8 both ways.
cd "$(dirname "$0")/../../.."
B=/tmp/b; G=/tmp/gfx; mkdir -p $B /tmp/fx $G $OUT/raw
tar -C $B -xJf .gpu-run/bins15.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz && tar -C $G -xJf .gpu-run/gb.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export NUVEC_GPU_FIXTURES=$G
if [[ $PART != bench ]]; then
(cd $B && timeout 170 ./cuda_ops --test-threads=2 > $OUT/raw/cuda_ops.log 2>&1; echo "cuda_ops rc $?")
grep -E "test result|panicked|FAILED|window" $OUT/raw/cuda_ops.log | head -30
(cd $B && timeout 90 ./cuda_bf16 --test-threads=1 --nocapture paged_decode > $OUT/raw/cuda_bf16-paged.log 2>&1; echo "cuda_bf16 paged rc $?")
grep -E "test result|panicked|RESULT" $OUT/raw/cuda_bf16-paged.log | head -20
for s in tiny small; do python3 scripts/make-random-checkpoint.py $G/random-$s-q4 --shape $s --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk-$s.log 2>&1; echo "mk $s rc $?"; done
(cd $B && timeout 280 ./gpu_batch --test-threads=1 --nocapture --skip moe_ --skip the_batcher_serves > $OUT/raw/gpu_batch-all.log 2>&1; echo "gpu_batch rc $?")
grep -E "^test |test result|panicked|RESULT gpu_batch" $OUT/raw/gpu_batch-all.log | head -50
fi
[[ $PART == tests ]] && { echo done; exit 0; }
python3 scripts/make-random-checkpoint.py /tmp/oss --shape gpt-oss-20b --layers 4 --vocab 32000 --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk-oss.log 2>&1; echo "mk oss rc $?"
python3 scripts/make-random-checkpoint.py /tmp/r8 --shape 8b --layers 8 --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk-8b.log 2>&1; echo "mk 8b rc $?"
for round in 1 2; do
  for m in oss r8; do
    for bin in nuvec-267c280 nuvec; do
      timeout 100 $B/$bin bench --model /tmp/$m --device cuda -p 512 -g 64 -b 1,8,32,64 -n 1 > $OUT/raw/bench-$m-$bin-r$round.log 2>&1
      echo "bench $m $bin round $round rc $?"; grep -E "generation_tps|batch_size" $OUT/raw/bench-$m-$bin-r$round.log | grep -oE "batch_size=[0-9]+|generation_tps=[0-9.]+" | paste -sd' ' | head -c 400; echo
    done
  done
done
for bin in nuvec-267c280 nuvec nuvec-267c280 nuvec; do
  timeout 60 $B/$bin bench --model /tmp/r8 --device cuda -p 512 -g 32 -n 1 --kv-bits 8 > $OUT/raw/bench-kv8-$bin.log 2>&1
  echo "bench r8 kv8 $bin rc $? $(grep Averages $OUT/raw/bench-kv8-$bin.log)"
done
echo done
