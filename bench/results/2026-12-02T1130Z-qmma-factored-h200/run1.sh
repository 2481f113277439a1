#!/bin/bash
# Device run 1 (eighteenth session): qmma in factored form (exact q on the tensor cores, scale and
# bias per group). Correctness, then old/new alternated on the random 8B, then ncu at B=8.
cd "$(dirname "$0")/.."
B=.cuda-bin
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed"
(cd $B && timeout 200 ./cuda_bf16 --test-threads=1 --nocapture batched_decode linear_quantized linear_many linear_dense 2>&1 | grep -E "^test |test result|panicked|RESULT linear bf16 q4 g64 bf16 k=4096|max_rel" | head -60)
(cd $B && timeout 100 ./cuda_ops --test-threads=1 linear 2>&1 | grep -E "^test |test result|panicked" | head -20)
run() { local bin=$1 b=$2 tag=$3; shift 3; r=$(env "$@" $B/$bin bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E "Averages|rror" | tail -1); echo "$tag B=$b $r"; }
for round in 1 2; do
  for b in 8 32; do
    run nuvec-old $b old X=1
    run nuvec $b new X=1
  done
done
for b in 1 2 4 16; do run nuvec-old $b old X=1; run nuvec $b new X=1; done
run nuvec 64 new X=1
timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv -f \
  $B/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 4 -b 8 -n 1 --no-warmup > $OUT/ncu8.csv 2>$OUT/ncu8.err
echo "ncu8 rc=$?"
timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv -f \
  $B/nuvec bench --model /tmp/m8b --device cuda -p 16 -g 4 -b 32 -n 1 --no-warmup > $OUT/ncu32.csv 2>$OUT/ncu32.err
echo "ncu32 rc=$?"
echo done
