#!/bin/bash
# Device run 38: kernel time per decode step by kernel (ncu), B = 2 and 8 paged, B = 1 eager.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q7.tar.xz
python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }
for b in 2 8; do
  timeout 200 ncu --print-units base --csv --page raw --metrics gpu__time_duration.sum /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 4 -g 9 -b $b -n 1 --no-warmup > /tmp/ncu$b.csv 2>/tmp/ncu$b.err
  echo "== B=$b (8 decode steps + prefill)"; python3 .dev/agg.py /tmp/ncu$b.csv 8 || tail -5 /tmp/ncu$b.err
done
NUVEC_CUDA_GRAPHS=0 timeout 200 ncu --print-units base --csv --page raw --metrics gpu__time_duration.sum /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 4 -g 9 -n 1 --no-warmup > /tmp/ncu1.csv 2>/tmp/ncu1.err
echo "== B=1 eager"; python3 .dev/agg.py /tmp/ncu1.csv 8 || tail -5 /tmp/ncu1.err
echo done
