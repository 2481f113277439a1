#!/bin/bash
# Device run 5: qmma software pipeline + whole-wave ranges: correctness, then A/B on the random 8B.
cd "$(dirname "$0")/.."
B=.cuda-bin
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed"
(cd $B && timeout 150 ./cuda_bf16 --test-threads=1 batched_decode linear_quantized linear_many 2>&1 | grep -E "^test |test result|panicked" | head -20)
NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/bf16 timeout 120 $B/gpu_parity_bf16 --nocapture q4_batched_decode 2>&1 | grep -E "^test |RESULT|test result|panicked|differ|margin" | head -20
run() { local bin=$1 b=$2 tag=$3; shift 3; r=$(env "$@" $B/$bin bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E "Averages|rror" | tail -1); echo "$tag B=$b $r"; }
for round in 1 2; do
  for b in 8 32; do
    run nuvec-base $b base X=1
    run nuvec $b new X=1
    run nuvec $b "prefetch0(waves only)" NUVEC_NVRTC_DEFINES=QM_PREFETCH=0
    run nuvec $b "old512rule(prefetch only)" NUVEC_QMMA_WAVE_BLOCKS=0
    run nuvec $b "minblocks3" NUVEC_NVRTC_DEFINES=QM_MIN_BLOCKS=3 NUVEC_QMMA_WAVE_BLOCKS=3
  done
done
for b in 1 2 4 16 64; do run nuvec $b new X=1; done
echo done
