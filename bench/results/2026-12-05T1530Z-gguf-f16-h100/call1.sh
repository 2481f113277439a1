#!/bin/bash
# Device call 1 (this session): the f16 paged decode kernels' tests, then the 8B Q4_0 GGUF's
# batched decode, main's binary (nuvec-old) against this one (nuvec) alternated, and llama.cpp's
# llama-batched-bench on the same file when its background build has finished.
cd "$(dirname "$0")/.."
T0=$(date +%s); left() { echo $((580 - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok && tar -C $B -xJf .gpu-run/bins3.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok3.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
SRC=$(bench/llama-cpp source)
(bench/llama-cpp build cuda llama-bench llama-batched-bench > /tmp/llama-build.log 2>&1; echo "build rc $?" >> /tmp/llama-build.log) &
(PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/l8b.part --arch llama-3.1-8b --tokenizer /tmp/tok/llama3_1 && mv $WORK/l8b.part $WORK/l8b.gguf
 PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/a3b.part --arch qwen3-30b-a3b --tokenizer /tmp/tok/qwen3 && mv $WORK/a3b.part $WORK/a3b.gguf) > /tmp/gguf.log 2>&1 &
mkdir -p /tmp/fx && python3 scripts/make-random-checkpoint.py /tmp/fx/random-small-q4 --shape small > /dev/null 2>&1
export NUVEC_GPU_FIXTURES=/tmp/fx
t() { local s=$1; shift; echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "^test .*(FAIL|ok$)|test result|panicked|assert|FAIL|RESULT" | head -30); }
t 200 ./cuda_bf16 --test-threads=2 --nocapture paged_decode
t 60 ./cuda_half_kv --test-threads=2
t 90 ./gpu_batch --test-threads=1 --nocapture --exact f16_caches_of_a_half_model_batched_on_the_gpu shared_prefixes_decode_as_alone_on_the_gpu
echo "left $(left) s"; tail -n 2 /tmp/gguf.log; ls -la $WORK
while [[ ! -f $WORK/l8b.gguf && $(left) -gt 300 ]]; do sleep 5; done
# nuvec bench -b B, old and new alternated, two rounds.
for r in 1 2; do
  for b in 1 8 32 64; do
    for e in nuvec-old nuvec; do
      [[ $(left) -lt 100 ]] && break 3
      timeout 60 $B/$e bench --model $WORK/l8b.gguf --device cuda -p 512 -g 128 -b $b -n 1 > $OUT/raw/$e-b$b-r$r.log 2>&1
      echo "$e B=$b r$r: $(grep -o 'generation_tps=[0-9.]*' $OUT/raw/$e-b$b-r$r.log | tail -1) $(grep -i error $OUT/raw/$e-b$b-r$r.log | head -2)"
    done
  done
done
tail -n 2 /tmp/llama-build.log
LBIN=$(bench/llama-cpp build cuda llama-batched-bench 2>/dev/null) || true
echo "left $(left) s"
if [[ -x "$LBIN/llama-batched-bench" && $(left) -gt 60 ]]; then
  timeout $(( $(left) - 10 )) $LBIN/llama-batched-bench -m $WORK/l8b.gguf -ngl 99 -fa on -npp 512 -ntg 128 -npl 1,8,32,64 -c 41000 > $OUT/raw/llama-batched.log 2>&1
  grep -E "^\|" $OUT/raw/llama-batched.log | tail -6
fi
echo "left $(left) s"; tail -n 3 /tmp/gguf.log; echo done
