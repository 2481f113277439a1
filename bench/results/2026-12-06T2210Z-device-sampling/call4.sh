#!/bin/bash
# Session 52, call 4 (about 150 s of device time): read_later waiting on its own event, its
# page-locked buffers kept per length; the refusal of pipelining beside staged uploads taken out
# of this build. cuda_ops' pending reads (its first process compiles the kernels: call 3's 60 s
# limit stopped it there); gpu_batch's Batcher against solo runs, pipelined, plain and invariant,
# with pageable and then with staged uploads. Never ran (no device time left). Its build:
# main at ec6ecb3 with read_later_pool.patch applied and refuse_untried_pipelining's check made
# `if false && …` (engine/batcher.rs), so that the pipelined mode runs beside staged uploads.
cd "$(dirname "$0")/../../.."
B=/tmp/b; G=/tmp/gfx; mkdir -p $B $G $OUT/raw
tar -C $B -xJf .gpu-run/bins7.tar.xz && tar -C $G -xJf .gpu-run/gfx.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd $B && timeout 120 ./cuda_ops --test-threads=1 embed_spliced 2>&1 | tee $OUT/raw/cuda_ops.log | grep -E "^test |test result|panicked" | head -4)
for st in 0 1; do
  (cd $B && NUVEC_STAGED_UPLOADS=$st NUVEC_GPU_FIXTURES=$G timeout 60 ./gpu_batch --test-threads=1 --nocapture the_batcher_serves 2>&1 | tee $OUT/raw/gpu_batch-st$st.log | grep -E "RESULT|test result|panicked|left|right" | head -12)
done
echo done
