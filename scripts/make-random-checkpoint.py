#!/usr/bin/env python3
"""A random-weight MLX-format 4-bit Llama checkpoint, for speed measurements only (its text is noise).

Usage: make-random-checkpoint.py OUT_DIR [--shape 8b|1b|tiny|small|a3b|gpt-oss-20b] [--layers N] [--bits 4] [--group-size 64]
       [--tokenizer DIR]   (copies DIR's tokenizer.json / tokenizer_config.json: vocab 32000 fits
                            the mistral fixtures' tokenizer)
       a3b: Qwen3-30B-A3B's shape (qwen3_moe: 48 layers of 128 stacked experts, 8 per token,
       vocab 151936 for Qwen3's tokenizer); gpt-oss-20b: its shape (gpt_oss: 24 layers alternating
       128-position sliding and full attention with sinks, 32 stacked experts with biases, 4 per
       token, the router in 8 bits as mlx-community's, vocab 201088); --layers cuts any shape's
       layer count.
       [--vocab N]         (embedding and head rows: 128256 with Llama 3.1's tokenizer)
       [--seed N]          (the random block's seed, 0: the same seed writes the same file)

Standard library only, so it runs on the GPU machine (where the multi-GB file is written instead of
travelling). Packed weights repeat one 64 MiB random block (`--seed`, 0 by default: the same
seed writes the same file, so measurements in different calls see the same answers); scales are 0.02 and biases -0.16 (bf16),
so dequantized weights lie in about [-0.16, 0.14], as small random init would.
"""

import argparse
import json
import os
import random
import shutil
import struct

SHAPES = {
    # Llama-3.1-8B's shape (vocab cut to 32000 to fit the fixtures' tokenizer).
    "8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, inter=14336, vocab=32000),
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, inter=8192, vocab=32000),
    "tiny": dict(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, inter=256, vocab=32000),
    # Head size 64 and four query heads per KV head: the tensor-core attention kernels' smallest case.
    "small": dict(hidden=256, layers=2, heads=8, kv_heads=2, head_dim=64, inter=512, vocab=32000),
    "a3b": dict(hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, inter=6144, vocab=151936,
                experts=128, top_k=8, moe_inter=768),
    "gpt-oss-20b": dict(hidden=2880, layers=24, heads=64, kv_heads=8, head_dim=64, inter=2880, vocab=201088,
                        experts=32, top_k=4, moe_inter=2880, window=128),
}


def bf16(x):
    return struct.pack("<f", x)[2:4]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="8b", choices=SHAPES)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--tokenizer")
    ap.add_argument("--seed", type=int, default=0, help="the random block's seed: the same seed writes the same "
                    "weights, so runs on checkpoints made in different calls compare (answers included)")
    ap.add_argument("--vocab", type=int, help="rows of the embedding and head (default: the shape's 32000; "
                    "128256 for Llama 3.1's tokenizer)")
    a = ap.parse_args()
    s = dict(SHAPES[a.shape])
    if a.vocab:
        s["vocab"] = a.vocab
    if a.layers:
        s["layers"] = a.layers
    moe = "experts" in s
    oss = a.shape == "gpt-oss-20b"
    bits = {}  # matrices quantized to other than --bits
    h, hd = s["hidden"], s["head_dim"]
    matrices = [("model.embed_tokens", s["vocab"], h), ("lm_head", s["vocab"], h)]
    tensors = [("model.norm.weight", "BF16", [h], bf16(1.0))]
    for i in range(s["layers"]):
        p = f"model.layers.{i}"
        matrices += [
            (f"{p}.self_attn.q_proj", s["heads"] * hd, h),
            (f"{p}.self_attn.k_proj", s["kv_heads"] * hd, h),
            (f"{p}.self_attn.v_proj", s["kv_heads"] * hd, h),
            (f"{p}.self_attn.o_proj", h, s["heads"] * hd),
        ]
        if oss:  # biased projections, sinks, a biased 8-bit router, biased experts under "experts"
            e, mi = s["experts"], s["moe_inter"]
            matrices += [(f"{p}.mlp.router", e, h), (f"{p}.mlp.experts.gate_proj", (e, mi), h),
                         (f"{p}.mlp.experts.up_proj", (e, mi), h), (f"{p}.mlp.experts.down_proj", (e, h), mi)]
            bits[f"{p}.mlp.router"] = 8
            for name, shape in [("self_attn.q_proj", [s["heads"] * hd]), ("self_attn.k_proj", [s["kv_heads"] * hd]),
                                ("self_attn.v_proj", [s["kv_heads"] * hd]), ("self_attn.o_proj", [h]),
                                ("mlp.router", [e]), ("mlp.experts.gate_proj", [e, mi]),
                                ("mlp.experts.up_proj", [e, mi]), ("mlp.experts.down_proj", [e, h])]:
                tensors.append((f"{p}.{name}.bias", "BF16", shape, bf16(0.01)))
            tensors.append((f"{p}.self_attn.sinks", "BF16", [s["heads"]], bf16(0.5)))
        elif moe:  # a router and the experts stacked [experts, rows, cols], as mlx-lm's SwitchGLU
            e, mi = s["experts"], s["moe_inter"]
            matrices += [(f"{p}.mlp.gate", e, h), (f"{p}.mlp.switch_mlp.gate_proj", (e, mi), h),
                         (f"{p}.mlp.switch_mlp.up_proj", (e, mi), h), (f"{p}.mlp.switch_mlp.down_proj", (e, h), mi)]
            tensors += [(f"{p}.self_attn.q_norm.weight", "BF16", [hd], bf16(1.0)),
                        (f"{p}.self_attn.k_norm.weight", "BF16", [hd], bf16(1.0))]
        else:
            matrices += [(f"{p}.mlp.gate_proj", s["inter"], h), (f"{p}.mlp.up_proj", s["inter"], h),
                         (f"{p}.mlp.down_proj", h, s["inter"])]
        tensors += [(f"{p}.input_layernorm.weight", "BF16", [h], bf16(1.0))]
        tensors += [(f"{p}.post_attention_layernorm.weight", "BF16", [h], bf16(1.0))]
    for name, rows, cols in matrices:
        rows = list(rows) if isinstance(rows, tuple) else [rows]
        tensors.append((f"{name}.weight", "U32", rows + [cols * bits.get(name, a.bits) // 32], None))
        tensors.append((f"{name}.scales", "BF16", rows + [cols // a.group_size], bf16(0.02)))
        tensors.append((f"{name}.biases", "BF16", rows + [cols // a.group_size], bf16(-0.16)))
    size = {"U32": 4, "BF16": 2}
    header, offset = {}, 0
    for name, dtype, shape, _ in tensors:
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    meta = json.dumps(header).encode()
    meta += b" " * (-len(meta) % 8)
    os.makedirs(a.out, exist_ok=True)
    block = random.Random(a.seed).randbytes(64 << 20)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(meta)) + meta)
        for name, dtype, shape, fill in tensors:
            n = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            if fill is None:
                while n > 0:
                    f.write(block[: min(n, len(block))])
                    n -= min(n, len(block))
            else:
                f.write(fill * (n // len(fill)))
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": h,
        "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": hd,
        "intermediate_size": s["inter"],
        "vocab_size": s["vocab"],
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "quantization": {"group_size": a.group_size, "bits": a.bits},
    }
    if oss:
        q = {"group_size": a.group_size, "bits": a.bits, "mode": "affine"}
        q.update({name: {"group_size": a.group_size, "bits": b} for name, b in bits.items()})
        config = {
            "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": h,
            "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
            "num_key_value_heads": s["kv_heads"], "head_dim": hd, "intermediate_size": s["moe_inter"],
            "num_local_experts": s["experts"], "num_experts_per_tok": s["top_k"], "vocab_size": s["vocab"],
            "rms_norm_eps": 1e-5, "rope_theta": 150000.0, "sliding_window": s["window"], "swiglu_limit": 7.0,
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(s["layers"])],
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "original_max_position_embeddings": 4096, "truncate": False},
            "max_position_embeddings": 131072, "tie_word_embeddings": False, "eos_token_id": 200002,
            "pad_token_id": 199999, "quantization": q, "quantization_config": q,
        }
    elif moe:
        config.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=s["experts"],
                      num_experts_per_tok=s["top_k"], moe_intermediate_size=s["moe_inter"], norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6, rope_theta=1000000.0)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    if a.tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(a.tokenizer, name)):
                shutil.copy(os.path.join(a.tokenizer, name), a.out)
    print(f"{a.out}: {a.shape}, {offset / 1e9:.2f} GB of tensors")


if __name__ == "__main__":
    main()
