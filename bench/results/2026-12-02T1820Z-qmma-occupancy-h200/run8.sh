#!/bin/bash
# Device run (twentieth session): the qmma kernels with fewer pipeline slots and a register cap
# (NUVEC_NVRTC_DEFINES: QM_STAGES, QM_MIN_BLOCKS; the host sizes shared memory and the K ranges by
# the same QM_STAGES), checked by cuda_bf16's batched-decode tests, then the random 8B's batched
# decode for each setting, alternated; stops starting runs after LIMIT seconds.
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-520}
mkdir -p /tmp/e && tar -C /tmp/e -xJf .cuda-bin/exp.tar.xz; E=/tmp/e
[ -d /tmp/m8b ] || (python3 scripts/make-random-checkpoint.py /tmp/m8b --shape 8b --tokenizer .dev/tok >/dev/null 2>&1 || echo "make 8b failed") &
CFGS=("" "QM_STAGES=2" "QM_STAGES=2,QM_MIN_BLOCKS=5" "QM_STAGES=2,QM_MIN_BLOCKS=6")
if [ "${TESTS:-1}" = 1 ]; then
for cfg in "${CFGS[@]}"; do
  echo "== tests [$cfg] $(cd $E && NUVEC_NVRTC_DEFINES=$cfg timeout 120 ./cuda_bf16 --test-threads=1 batched_decode linear_quantized linear_many 2>&1 | grep -E "test result|panicked|FAILED" | head -3 | tr '\n' ' ')"
done
fi
wait
for round in ${ROUNDS:-1 2}; do for b in ${BATCHES:-8 16 32}; do for cfg in "${CFGS[@]}"; do
  [ $SECONDS -gt $LIMIT ] && { echo "stopped at ${SECONDS}s"; exit 0; }
  echo "r$round [$cfg] B=$b $(NUVEC_NVRTC_DEFINES=$cfg $E/nuvec bench --model /tmp/m8b --device cuda -p 512 -g 128 -b $b -n 1 2>&1 | grep -E 'Averages|rror' | tail -1) t=${SECONDS}s"
done; done; done
echo done
