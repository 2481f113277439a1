#!/usr/bin/env bash
# Builds the CUDA-graph GPU checks here and copies what the device needs into the git-ignored
# .cuda-bin/ (binaries, stripped) and .gpu-fixtures/ (three fixture cases, ~21 MB), for a run on
# the GPU machine with carry [".cuda-bin", ".gpu-fixtures"]. See docs/cuda-graphs.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. ~/.cache/nuvec/env.sh
F=$NUVEC_FIXTURES
mkdir -p .cuda-bin .gpu-fixtures
for c in mistral-q4g64 qwen3-q4g64 qwen3_moe-q4g64; do
  mkdir -p .gpu-fixtures/$c
  cp "$F/$c/config.json" "$F/$c"/model*.safetensors* .gpu-fixtures/$c/
done
cp "$F"/mistral-q4g64/tokenizer*.json .gpu-fixtures/mistral-q4g64/   # for nuvec bench / generate
# The test binaries' paths, as cargo prints them ("Executable tests/NAME.rs (target/...)").
exe() { sed -n "s|.*Executable tests/$1.rs (\(.*\))|\1|p"; }
nuvec_tests=$(cargo test --release -p nuvec --features cuda --no-run 2>&1)
lm_tests=$(cargo test --release -p nuvec-lm --features cuda --no-run 2>&1)
cp "$(echo "$nuvec_tests" | exe cuda_graph)" .cuda-bin/cuda_graph
cp "$(echo "$nuvec_tests" | exe cuda_ops)" .cuda-bin/cuda_ops   # the eager kernels (step scalars null)
cp "$(echo "$lm_tests" | exe cuda_graphs)" .cuda-bin/cuda_graphs
cp "$(echo "$lm_tests" | exe gpu_parity)" .cuda-bin/gpu_parity
cargo build --release -p nuvec-cli --features cuda
cp target/release/nuvec .cuda-bin/nuvec
strip .cuda-bin/cuda_graph .cuda-bin/cuda_ops .cuda-bin/cuda_graphs .cuda-bin/gpu_parity .cuda-bin/nuvec
du -sh .cuda-bin .gpu-fixtures
