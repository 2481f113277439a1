#!/bin/bash
# Device run 46: the paged flash decode with one table lookup per key for K and V (q14) against
# q13 (run 45's); issue 24's workload at 64 concurrent, flash on and off.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n /tmp/o && rm -rf /tmp/n/* /tmp/o/* && tar -C /tmp/n -xJf .cuda-bin/q14.tar.xz && tar -C /tmp/o -xJf .cuda-bin/q13.tar.xz
tar -C .dev -xJf .dev/tok.tar.xz; xz -dc .dev/workload-64.json.xz > /tmp/w64.json
(python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
(cd /tmp/n && timeout 150 ./cuda_bf16 --test-threads=1 --nocapture paged_decode 2>&1 | grep -E "^test |test result|panicked|RESULT paged" | head)
wait
b() { local bin=$1 bb=$2 p=$3 g=$4; echo "$bin B=$bb p=$p $(timeout 60 $bin/nuvec bench --model /tmp/m8b --device cuda -p $p -g $g -b $bb -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//' | tr '\n' ' ')"; }
for bin in /tmp/n /tmp/o /tmp/n /tmp/o; do b $bin 64 512 64; done
for bin in /tmp/n /tmp/o; do b $bin 64 2048 32; done
for f in 1 0; do echo "workload C=64 flash=$f $(NUVEC_PAGED_FLASH=$f timeout 120 /tmp/n/nuvec bench --model /tmp/m8b --workload /tmp/w64.json --device cuda 2>&1 | grep -E 'Workload results|prefix|rror|panick' | tr '\n' ' ')"; done
echo done
