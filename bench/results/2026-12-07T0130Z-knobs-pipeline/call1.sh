#!/bin/bash
# Session 53, call 1: main at the per-device knobs and the fused silu removal (bb68deb) with read_later's page-locked
# buffers kept per length, each with its own event (the last session's read_later_pool.patch),
# and the refusal of pipelined steps beside staged uploads taken out. Tests first: cuda_ops (all),
# gpu_batch (all; the_batcher_serves with pageable then staged uploads: pipelined, plain and
# invariant against solo runs), gpu_parity and cuda_graphs on the carried fixtures. Then the issue
# 24 workload at 64 concurrent on the random 1b and 8B, greedy, four settings alternated:
# old (pageable, not pipelined), st (staged), pipe (pipelined), both.
cd "$(dirname "$0")/../../.."
T0=$(date +%s); left() { echo $((${BUDGET:-560} - ($(date +%s) - T0))); }
B=/tmp/b; WORK=/tmp/gb; G=/tmp/gfx; mkdir -p $B /tmp/fx $WORK $G $OUT/raw
tar -C $B -xJf .gpu-run/bins9.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz && tar -C $G -xJf .gpu-run/gfx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 scripts/make-random-checkpoint.py $WORK/m1b --shape 1b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk1.log 2>&1; echo "mk rc $?" >> /tmp/mk1.log;
 python3 scripts/make-random-checkpoint.py $WORK/m8b --shape 8b --seed 0 --tokenizer /tmp/fx/mistral-q4g64 > /tmp/mk.log 2>&1; echo "mk rc $?" >> /tmp/mk.log) &
python3 - <<'PY'
import sys, types
sys.path.insert(0, "bench")
from compare_serve_workload import workload
a = types.SimpleNamespace(seed=0, vocab=32000, prefix=4096, prompt=1024, requests_per_slot=2, gen=256, rate=0.0)
workload(a, 64, "/tmp/w64.json")
PY
export NUVEC_GPU_FIXTURES=$G
t() { local s=$1 tag=$2; shift 2; local s0=$(date +%s); echo "== $tag (left $(left) s)"
  (cd $B && timeout $s "$@" > $OUT/raw/$tag.log 2>&1; echo "rc $?" >> $OUT/raw/$tag.log)
  grep -E "test result|panicked|FAILED|left:|right:|^rc " $OUT/raw/$tag.log | head -12; echo "   ($(( $(date +%s) - s0 )) s)"; }
t 200 cuda_ops ./cuda_ops --test-threads=2
t 60 gpu_batch-st0 ./gpu_batch --test-threads=1 --nocapture the_batcher_serves
NUVEC_STAGED_UPLOADS=1 t 60 gpu_batch-st1 ./gpu_batch --test-threads=1 --nocapture the_batcher_serves
t 200 gpu_batch ./gpu_batch --test-threads=1
t 120 gpu_parity ./gpu_parity --test-threads=1 --exact q4_model f16_cache_chunked_prefill bf16_rotating_cache_chunked_prompt qwen3_moe_q4_model longer_prompt_chunked_prefill rotating_cache_whole_prompt rotating_cache_moe greedy_generation_on_device_q4 greedy_generation_on_device_qwen3_moe
t 90 cuda_graphs ./cuda_graphs --test-threads=1 --exact graphs_equal_eager_mistral_q4 generation_with_graphs_gives_the_eager_tokens moe_capture_fails_and_falls_back_to_eager
set_of() { case $1 in old) echo "NUVEC_STAGED_UPLOADS=0 NUVEC_BATCH_PIPELINE=0";; st) echo "NUVEC_STAGED_UPLOADS=1 NUVEC_BATCH_PIPELINE=0";;
  pipe) echo "NUVEC_STAGED_UPLOADS=0 NUVEC_BATCH_PIPELINE=1";; both) echo "NUVEC_STAGED_UPLOADS=1 NUVEC_BATCH_PIPELINE=1";; esac; }
w() { local m=$1 c=$2 tag=w64-$1-$2-r$3; shift 3; local s0=$(date +%s)
  env $(set_of $c) timeout 100 $B/nuvec bench --model $WORK/$m --workload /tmp/w64.json --device cuda "$@" > $OUT/raw/$tag.log 2>&1
  echo "$tag ($(( $(date +%s) - s0 )) s): $(grep -E 'Workload (steps|results|pipeline)|rror|panick' $OUT/raw/$tag.log | tr '\n' ' ')"; }
while ! grep -q "mk rc" /tmp/mk1.log && [[ $(left) -gt 60 ]]; do sleep 2; done; tail -1 /tmp/mk1.log
for r in 1 2; do for c in old st pipe both; do [[ $(left) -gt 40 ]] && w m1b $c $r; done; done
while ! grep -q "mk rc" /tmp/mk.log && [[ $(left) -gt 60 ]]; do sleep 2; done; tail -1 /tmp/mk.log
for r in 1 2; do for c in both pipe st old; do [[ $(left) -gt 40 ]] && w m8b $c $r; done; done
echo "left $(left) s"; echo done
