#!/bin/bash
# Device run 4: qmma factored + pipelined + whole-wave ranges (v3) against the kernel at ecb0fd0
# (old) and the pipeline alone (v2). Correctness (unit and model level), then A/B on the random 8B.
cd "$(dirname "$0")/.."
B=.cuda-bin
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed"
(cd $B && timeout 200 ./cuda_bf16 --test-threads=1 --nocapture batched_decode linear_quantized linear_many 2>&1 | grep -E "^test |test result|panicked|k=4096 n=1000 m=(2|9|17) " | head -30)
NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/bf16 timeout 150 $B/gpu_parity_bf16 --nocapture q4_batched_decode 2>&1 | grep -E "^test |RESULT|test result|panicked|differ|margin|sequences" | head -30
run() { local bin=$1 b=$2 tag=$3; shift 3; r=$(env "$@" $B/$bin bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E "Averages|rror" | tail -1); echo "$tag B=$b $r"; }
for round in 1 2; do
  for b in 8 32; do
    run nuvec-old $b old X=1
    run nuvec-v2 $b v2 X=1
    run nuvec $b v3 X=1
  done
done
for b in 1 2 4 16 64; do run nuvec $b v3 X=1; done
timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv -f \
  $B/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 4 -b 8 -n 1 --no-warmup > $OUT/ncu8.csv 2>$OUT/ncu8.err
echo "ncu8 rc=$?"
echo done
