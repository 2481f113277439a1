#!/bin/bash
# Device run 85: gpu_adapters again (run 84's build loaded the tokenizer, which the GPU fixtures
# lack), cuda_ops' elementwise test with its whole output, and issue 24's time to first token
# under Poisson arrivals (1k prompts, half after a 4k shared prefix, 256 generated) at 32
# concurrent, 8 and 16 requests/s, on the random 8B of run 84.
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/n && tar -C /tmp/n -xJf .cuda-bin/lora.tar.xz
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core
echo "== gpu_adapters"; timeout 120 /tmp/n/gpu_adapters 2>&1 | tail -12
echo "== cuda_ops copies_and_elementwise"; timeout 120 /tmp/n/cuda_ops copies_and_elementwise 2>&1 | tail -12
[ -f /tmp/m8b-l3/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b-l3 --shape 8b --tokenizer .dev/tok-llama3 --vocab 128256 >/dev/null 2>&1 || echo "make 8b-l3 failed"
python3 - <<'PY'
import sys; sys.path.insert(0, "bench")
from types import SimpleNamespace
from compare_serve_workload import workload
for rate in (8.0, 16.0):
    workload(SimpleNamespace(seed=0, vocab=128000, prefix=4096, prompt=1024, requests_per_slot=2, gen=256, rate=rate), 32, f"/tmp/wl32-{int(rate)}.json")
PY
for r in 8 16 8 16; do echo "== workload C=32 rate $r"; timeout 120 /tmp/n/nuvec bench --model /tmp/m8b-l3 --device cuda --workload /tmp/wl32-$r.json 2>&1 | grep -E "Workload" ; done
echo done
