#!/bin/bash
# Device run 42: register kernels with the scales a batch ahead (default) against their load at
# the batch's start (QIR_PARAMS_AHEAD=0) and the bf16 forms (NUVEC_QIMMA=0); 8-layer random 8B.
cd "$(dirname "$0")/.."
mkdir -p /tmp/n && rm -rf /tmp/n/* && tar -C /tmp/n -xJf .cuda-bin/q10.tar.xz
python3 scripts/make-random-checkpoint.py /tmp/m8 --shape 8b --layers 8 --tokenizer .dev/tok >/tmp/mk.log 2>&1 || { echo "make failed"; tail -5 /tmp/mk.log; }
for b in 8 2; do for v in ahead start off; do
  case $v in ahead) e="";; start) e="NUVEC_NVRTC_DEFINES=QIR_PARAMS_AHEAD=0";; off) e="NUVEC_QIMMA=0";; esac
  echo "B=$b $v $(env $e timeout 30 /tmp/n/nuvec bench --model /tmp/m8 --device cuda -p 512 -g 64 -b $b -n 1 2>&1 | grep -E 'Averages|rror|panick' | sed -e 's/prompt_tps=[0-9.]*,//' | tr '\n' ' ')"
done; done
(cd /tmp/n && timeout 40 ./cuda_bf16 --test-threads=1 batched_decode 2>&1 | grep -E "^test |test result|panicked" | head)
echo done
