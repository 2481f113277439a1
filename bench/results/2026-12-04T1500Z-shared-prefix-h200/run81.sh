#!/bin/bash
# Device run 81: the final build (px4: the flash kernels' shared tile helpers) against px3:
# cuda_bf16's attention tests, gpu_batch's Batcher and shared-prefix cases; prefill 4096 and the
# workload at 64 concurrent, alternated.
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/a /tmp/n && tar -C /tmp/a -xJf .cuda-bin/px3.tar.xz && tar -C /tmp/n -xJf .cuda-bin/px4.tar.xz
G=$PWD/.gpu-fixtures/core; T=$G/mistral-q4g64
([ -f /tmp/m8b/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer $T >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
python3 scripts/make-random-checkpoint.py $G/random-small-q4 --shape small --tokenizer $T >/dev/null 2>&1 || echo "make small failed"
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|error|RESULT" | head -40); }
echo "== cuda_bf16"; t 200 ./cuda_bf16 --test-threads=1 --nocapture attention_prefill paged_decode
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$G t 240 ./gpu_batch --test-threads=1 --nocapture shared the_batcher
wait
python3 - <<'PY'
import sys, types
sys.path.insert(0, "bench")
from compare_serve_workload import workload
a = types.SimpleNamespace(seed=0, vocab=32000, prefix=4096, prompt=1024, requests_per_slot=2, gen=256, rate=0.0)
workload(a, 64, "/tmp/w64.json")
PY
b() { echo "$1 $(timeout 90 $1/nuvec bench --model /tmp/m8b --device cuda -p 4096 -g 16 -n 2 2>&1 | grep -E 'Averages|rror|panick' | tr '\n' ' ')"; }
b /tmp/a; b /tmp/n; b /tmp/n; b /tmp/a
w() { echo "$1 $(timeout 120 $1/nuvec bench --model /tmp/m8b --workload /tmp/w64.json --device cuda 2>&1 | grep -E 'Workload|rror|panick' | tr '\n' ' ')"; }
w /tmp/n; w /tmp/a
echo done
