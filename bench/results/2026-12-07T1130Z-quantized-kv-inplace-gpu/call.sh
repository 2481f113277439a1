#!/bin/bash
# bins14: built from main 267c280 with --features cuda (nuvec, cuda_ops, gpu_batch, cuda_graphs, gpu_parity).
# Quantized paged KV on the GPU, with the decode reading the codes in place
# (attention.cu paged_attention_split_quant_f32, the rope's rows quantized into their slots):
# cuda_ops whole (attention.cu's loads changed for every store type; the new quantized ops),
# gpu_batch whole (the quantized case against each sequence's quantized cache alone),
# cuda_graphs' qwen3 case and gpu_parity's cases (the attention kernels graphs replay); then
# `nuvec bench` of an 8-layer cut of the 8B shape (4-bit g64) with and without --kv-bits,
# alternated, two rounds. PART=tests or PART=bench runs one half.
cd "$(dirname "$0")/../../.."
B=/tmp/b; G=/tmp/gfx; mkdir -p $B /tmp/fx $G $OUT/raw
tar -C $B -xJf .gpu-run/bins14.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz && tar -C $G -xJf .gpu-run/gfx.tar.xz && tar -C $G -xJf .gpu-run/q3.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export NUVEC_GPU_FIXTURES=$G
if [[ $PART != bench ]]; then
(cd $B && timeout 150 ./cuda_ops --test-threads=2 --nocapture > $OUT/raw/cuda_ops.log 2>&1; echo "cuda_ops rc $?")
grep -E "test result|panicked|quantized|MISMATCH" $OUT/raw/cuda_ops.log | head -30
for s in tiny small; do python3 scripts/make-random-checkpoint.py $G/random-$s-q4 --shape $s --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk-$s.log 2>&1; echo "mk $s rc $?"; done
(cd $B && timeout 220 ./gpu_batch --test-threads=1 --nocapture > $OUT/raw/gpu_batch-all.log 2>&1; echo "gpu_batch all rc $?")
grep -E "^test |test result|panicked|RESULT gpu_batch qwen3-q4g64 kv_bits" $OUT/raw/gpu_batch-all.log | head -40
(cd $B && timeout 60 ./cuda_graphs --test-threads=1 --exact graphs_equal_eager_qwen3_q4 > $OUT/raw/cuda_graphs-qwen3.log 2>&1; echo "graphs rc $?")
grep -E "test result|panicked" $OUT/raw/cuda_graphs-qwen3.log | head -4
(cd $B && timeout 120 ./gpu_parity --test-threads=1 --exact q4_model f16_cache_chunked_prefill bf16_rotating_cache_chunked_prompt qwen3_moe_q4_model longer_prompt_chunked_prefill rotating_cache_whole_prompt rotating_cache_moe greedy_generation_on_device_q4 greedy_generation_on_device_qwen3_moe > $OUT/raw/gpu_parity.log 2>&1; echo "gpu_parity rc $?")
grep -E "test result|panicked" $OUT/raw/gpu_parity.log | head -4
fi
[[ $PART == tests ]] && { echo done; exit 0; }
python3 scripts/make-random-checkpoint.py /tmp/r8 --shape 8b --layers 8 --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk-8b.log 2>&1; echo "mk 8b rc $?"
for round in 1 2; do
  for kv in none 8 4; do
    extra=""; [[ $kv != none ]] && extra="--kv-bits $kv"
    timeout 100 $B/nuvec bench --model /tmp/r8 --device cuda -p 512 -g 64 -b 1,8,32 -n 1 $extra > $OUT/raw/bench-kv$kv-r$round.log 2>&1
    echo "bench kv=$kv round $round rc $?"; grep -iE "tok/s|batch" $OUT/raw/bench-kv$kv-r$round.log | tail -6
  done
done
echo done
