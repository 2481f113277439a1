#!/bin/bash
# Device run 84: adapters on the GPU against the CPU (gpu_adapters), mul_columns against the CPU
# (cuda_ops), then on the random 8B with Llama 3.1's vocabulary: constrained batch 64 with the
# masks' thread pool (new) against the build before it (mask: a thread per row per token),
# alternated; a rank-8 LoRA on every projection against no adapter (nuvec bench, alternated);
# issue 24's time to first token for 1k prompts alone and 32 at once.
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/a /tmp/n && tar -C /tmp/a -xJf .cuda-bin/mask.tar.xz ./nuvec && tar -C /tmp/n -xJf .cuda-bin/lora.tar.xz
export NUVEC_GPU_FIXTURES=$PWD/.gpu-fixtures/core
echo "== gpu_adapters"; timeout 120 /tmp/n/gpu_adapters 2>&1 | tail -4
echo "== cuda_ops copies_and_elementwise"; timeout 60 /tmp/n/cuda_ops copies_and_elementwise 2>&1 | tail -3
[ -f /tmp/m8b-l3/config.json ] || python3 scripts/make-random-checkpoint.py /tmp/m8b-l3 --shape 8b --tokenizer .dev/tok-llama3 --vocab 128256 >/dev/null 2>&1 || echo "make 8b-l3 failed"
python3 - /tmp/ad8b <<'PY'
import json, os, struct, sys
out = sys.argv[1]; os.makedirs(out, exist_ok=True)
H, KV, I, L, R = 4096, 1024, 14336, 32, 8
mods = [("self_attn.q_proj", H, H), ("self_attn.k_proj", H, KV), ("self_attn.v_proj", H, KV), ("self_attn.o_proj", H, H),
        ("mlp.gate_proj", H, I), ("mlp.up_proj", H, I), ("mlp.down_proj", I, H)]
header, blobs, off = {}, [], 0
for l in range(L):
    for m, i, o in mods:
        for leaf, shape, val in (("lora_a", [i, R], 0.01), ("lora_b", [R, o], 0.001)):
            n = shape[0] * shape[1] * 4
            header[f"model.layers.{l}.{m}.{leaf}"] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
            blobs.append(struct.pack("<f", val) * (n // 4)); off += n
h = json.dumps(header).encode(); h += b" " * ((8 - len(h) % 8) % 8)
with open(out + "/adapters.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h))); f.write(h)
    for b in blobs: f.write(b)
json.dump({"fine_tune_type": "lora", "num_layers": -1, "lora_parameters": {"rank": R, "scale": 2.0, "dropout": 0.0}},
          open(out + "/adapter_config.json", "w"))
PY
export DEVICE=cuda GEN=128
for b in /tmp/n /tmp/a /tmp/n; do echo "== $b constrained batch 64"; NUVEC_BIN=$b/nuvec ROUNDS=1 BATCH=64 PROMPT=512 timeout 100 bench/compare-constrained /tmp/m8b-l3 2>&1 | tail -4; done
for r in 1 2; do
  for ad in none lora; do
    extra=""; [ $ad = lora ] && extra="--adapter-path /tmp/ad8b"
    echo "== bench $ad round $r"; timeout 60 /tmp/n/nuvec bench --model /tmp/m8b-l3 --device cuda -p 512 -g 128 $extra 2>&1 | tail -3
  done
done
python3 - <<'PY'
import sys; sys.path.insert(0, "bench")
from types import SimpleNamespace
from compare_serve_workload import workload
for c in (1, 32):
    workload(SimpleNamespace(seed=0, vocab=128000, prefix=4096, prompt=1024, requests_per_slot=2, gen=256, rate=0.0), c, f"/tmp/wl{c}.json")
PY
for c in 1 32; do echo "== workload C=$c"; timeout 120 /tmp/n/nuvec bench --model /tmp/m8b-l3 --device cuda --workload /tmp/wl$c.json 2>&1 | grep -E "Workload" ; done
echo done
