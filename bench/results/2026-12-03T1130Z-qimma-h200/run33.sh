#!/bin/bash
# Device run 33: qimma with scales in the pipeline (QI_STAGES 3). Tests, the random 8B at
# B = 2..64 (integer kernels off / on, alternated), then ncu durations per kernel at B=8, B=32.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q4.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|error|gpu .* vs" | head -40); }
t 200 ./cuda_bf16 --test-threads=1 batched_decode linear_many
NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 200 ./gpu_batch --test-threads=1
wait
for r in 1 2; do for b in 2 8 16 32 64; do for q in 0 1; do
  echo "r$r B=$b qimma=$q $(NUVEC_QIMMA=$q timeout 60 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E 'Averages|rror|panick' | tr '\n' ' ')"
done; done; done
for b in 8 32; do
  echo "r1 B=$b stages=2 $(NUVEC_NVRTC_DEFINES=QI_STAGES=2 timeout 60 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E 'Averages|rror|panick' | tr '\n' ' ')"
done
sum() { python3 -c '
import csv,sys,collections
rows=list(csv.reader(l for l in open(sys.argv[1]) if l.startswith("\"")))
h=rows[0]; i=h.index("Kernel Name"); v=h.index("Metric Value"); g=h.index("Grid Size")
d=collections.defaultdict(lambda:[0,0.0])
for r in rows[1:]:
    k=r[i].split("(")[0]+" grid"+r[g]; d[k][0]+=1; d[k][1]+=float(r[v].replace(",",""))
for k,(n,t) in sorted(d.items(), key=lambda x:-x[1][1])[:12]: print(f"{k:50s} n={n:5d} mean={t/n/1e3:8.2f}us")
' $1; }
for b in 8 32; do for q in 1; do
  NUVEC_QIMMA=$q timeout 120 ncu --csv --print-units base --metrics gpu__time_duration.sum -c 250 -k regex:'qimma|qmma|xsplit|silu|convert_bf16' /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 100 -g 3 -b $b -n 1 --no-warmup > /tmp/d.csv 2>/dev/null
  echo "== B=$b qimma=$q"; sum /tmp/d.csv
done; done
echo done
