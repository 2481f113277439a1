#!/bin/bash
# Device run 6: where a batched decode step's time goes (host vs kernels), qmma variants by ncu.
cd "$(dirname "$0")/.."
B=.cuda-bin
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed"
NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/bf16 timeout 100 $B/gpu_parity_bf16 --nocapture q4_batched_decode 2>&1 | grep -E "^test |RESULT|test result|panicked|differ|margin" | head -20
run() { local b=$1 tag=$2; shift 2; r=$(env "$@" $B/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E "Averages|rror" | tail -1); echo "$tag B=$b $r"; }
run 1 graphs X=1
run 1 eager NUVEC_CUDA_GRAPHS=0
run 8 new X=1
timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv -f \
  $B/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 6 -b 8 -n 1 --no-warmup > $OUT/ncu8_new.csv 2>$OUT/ncu8_new.err
echo "ncu new rc=$?"
NUVEC_NVRTC_DEFINES=QM_PREFETCH=0 NUVEC_QMMA_WAVE_BLOCKS=0 timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv -f \
  $B/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 6 -b 8 -n 1 --no-warmup > $OUT/ncu8_old.csv 2>$OUT/ncu8_old.err
echo "ncu old rc=$?"
echo done
