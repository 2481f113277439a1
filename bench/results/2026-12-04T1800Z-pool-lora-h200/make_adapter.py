"""A rank-8 LoRA (scale 2) on every projection of make-random-checkpoint.py's 8B shape, in
mlx-lm's adapter layout, with constant values: for timing only. Usage: make_adapter.py OUT_DIR"""
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
