#!/bin/bash
# Device run 78: gpu_batch with the shared-prefix case as logits against each sequence alone;
# issue 24's workload at 64 concurrent, shared-keys kernel on / off alternated (each run's steps
# split into decode-only and prefilling), the prefix cache off once.
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/n && tar -C /tmp/n -xJf .cuda-bin/px2.tar.xz
G=$PWD/.gpu-fixtures/core; T=$G/mistral-q4g64
([ -f /tmp/m8b/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer $T >/tmp/mk.log 2>&1 || { echo "make 8b failed"; tail -5 /tmp/mk.log; }) &
python3 scripts/make-random-checkpoint.py $G/random-small-q4 --shape small --tokenizer $T >/dev/null 2>&1 || echo "make small failed"
t() { local s=$1; shift; (cd /tmp/n && timeout $s "$@" 2>&1 | grep -E "^test |test result|panicked|assert|left|right|error|RESULT" | head -40); }
echo "== gpu_batch"; NUVEC_GPU_FIXTURES=$G t 240 ./gpu_batch --test-threads=1 --nocapture shared the_batcher dense
wait
python3 - <<'PY'
import sys, types
sys.path.insert(0, "bench")
from compare_serve_workload import workload
a = types.SimpleNamespace(seed=0, vocab=32000, prefix=4096, prompt=1024, requests_per_slot=2, gen=256, rate=0.0)
workload(a, 64, "/tmp/w64.json")
PY
w() { echo "$1 $(env $2 timeout 120 /tmp/n/nuvec bench --model /tmp/m8b --workload /tmp/w64.json --device cuda $3 2>&1 | grep -E 'Workload|rror|panick' | tr '\n' ' ')"; }
w on X=1 ""; w off NUVEC_PAGED_PREFIX_MIN_KEYS=0 ""; w off NUVEC_PAGED_PREFIX_MIN_KEYS=0 ""; w on X=1 ""
w no-prefix-cache X=1 --no-prefix-cache
echo done
