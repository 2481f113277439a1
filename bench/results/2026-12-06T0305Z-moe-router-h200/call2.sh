#!/bin/bash
# Call 2: per-kernel durations and occupancy (ncu, caches not flushed, graphs off) of a decode
# step of 2-layer copies of the Qwen3-30B-A3B and gpt-oss-20b GGUF shapes, with this binary.
cd "$(dirname "$0")/.."
T0=$(date +%s); left() { echo $((${BUDGET:-300} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok.tar.xz
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
SRC=$(bench/llama-cpp source)
PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/a3b2.gguf --arch qwen3-30b-a3b --layers 2 --tokenizer /tmp/tok/qwen3 > /dev/null 2>&1 &
PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/oss2.gguf --arch gpt-oss-20b --layers 2 --tokenizer /tmp/tok/gptoss > /dev/null 2>&1 &
wait
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M=gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,launch__occupancy_limit_registers,launch__grid_size
for m in a3b2 oss2; do
  $B/nuvec bench --model $WORK/$m.gguf --device cuda -p 512 -g 128 -n 1 2>&1 | grep -E "generation_tps|CUDA graphs" | head -2
  NUVEC_CUDA_GRAPHS=0 timeout 120 $NCU --cache-control none --metrics $M --csv -c 330 $B/nuvec bench --model $WORK/$m.gguf --device cuda -p 32 -g 16 -n 1 > $OUT/raw/ncu-$m.csv 2> $OUT/raw/ncu-$m.err
  # (a table of the last 26 launches printed from the CSV: duration, warps active, DRAM
  # throughput, registers, the register limit on blocks per SM, grid size)
  echo "left $(left) s"
done
echo done
