#!/bin/bash
# Device run 39: register-direct integer few-row kernels (qimma_b4_r8/r16) for 2-16 rows.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q8.tar.xz
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|gpu .* vs|assert|left|right" | head -24); }
echo "== cuda_bf16 default"; t 150 ./cuda_bf16 --test-threads=1
echo "== gpu_batch default"; NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core t 150 ./gpu_batch --test-threads=1
wait
for r in 1 2; do for b in 2 8 16; do for q in 0 d; do
  if [ $q = 0 ]; then export NUVEC_QIMMA=0; else unset NUVEC_QIMMA; fi
  echo "r$r B=$b qimma=$q $(timeout 60 /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 64 -b $b -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//' | tr '\n' ' ')"
done; done; done
unset NUVEC_QIMMA
timeout 120 ncu --print-units base --csv --page raw --metrics gpu__time_duration.sum,launch__registers_per_thread -k regex:qimma_b4_r /tmp/n/nuvec bench --model /tmp/m8b --device cuda -p 4 -g 3 -b 8 -n 1 --no-warmup > /tmp/ncu8.csv 2>/tmp/ncu8.err
python3 - <<'PY'
import csv
rows=list(csv.reader(open('/tmp/ncu8.csv')))
h=[i for i,r in enumerate(rows) if 'Kernel Name' in r][0]; hd=rows[h]
ki,gi,ti,ri=hd.index('Kernel Name'),hd.index('Grid Size'),hd.index('gpu__time_duration.sum'),hd.index('launch__registers_per_thread')
import collections; a=collections.defaultdict(list)
for r in rows[h+1:]:
    try: a[(r[ki].split('(')[0],r[gi],r[ri])].append(float(r[ti]))
    except: pass
for k,v in a.items(): print(k, len(v), 'mean us %.2f'%(sum(v)/len(v)/1e3))
PY
echo done
