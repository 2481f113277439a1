#!/usr/bin/env python3
"""A random-weight MLX checkpoint of a real architecture, made with mlx-lm's own model classes,
for speed comparisons only (its text is noise): bench/compare-gpu makes one per architecture and
both engines load the same files.

Usage: make_mlx_random.py OUT_DIR --arch qwen3-0.6b|llama-3.1-8b|qwen3-30b-a3b|gpt-oss-20b|gpt-oss-20b-mxfp4|
                                         gemma-4-26b-a4b
       [--layers N] [--bits 4] [--group-size 64] --tokenizer DIR

The weights are mlx's default initialisation under seed 0, cast to bfloat16 and quantized with
`nn.quantize` (affine, bf16 scales and biases; embeddings and the LM head included), as
`mlx_lm.convert -q` leaves a bf16 model. gpt-oss-20b-mxfp4 is quantized as mlx-community's
gpt-oss MXFP4-Q8 checkpoints are (and as its GGUFs load): the experts in mxfp4, everything else
affine 8-bit in groups of 64 (mlx_lm.utils.quantize_model; --bits and --group-size do not apply).
--layers cuts the layer count (say so when reporting).
"""

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

CONFIGS = {
    # Qwen/Qwen3-0.6B config.json (the fields mlx-lm reads).
    "qwen3-0.6b": dict(
        model_type="qwen3", hidden_size=1024, num_hidden_layers=28, intermediate_size=3072,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        vocab_size=151936, rope_theta=1000000.0, max_position_embeddings=40960,
        tie_word_embeddings=True, hidden_act="silu",
    ),
    # meta-llama/Llama-3.1-8B config.json.
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
        vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072,
        tie_word_embeddings=False, hidden_act="silu", attention_bias=False, mlp_bias=False,
        rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192, rope_type="llama3"),
    ),
    # Qwen/Qwen3-30B-A3B config.json: 128 experts of 768, 8 per token.
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, intermediate_size=6144,
        moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], num_attention_heads=32, num_key_value_heads=4,
        head_dim=128, rms_norm_eps=1e-6, vocab_size=151936, rope_theta=1000000.0,
        max_position_embeddings=40960, tie_word_embeddings=False, hidden_act="silu",
    ),
    # openai/gpt-oss-20b config.json: 32 experts of 2880, 4 per token; sliding and full layers.
    "gpt-oss-20b": dict(
        model_type="gpt_oss", hidden_size=2880, num_hidden_layers=24, intermediate_size=2880,
        num_local_experts=32, num_experts_per_tok=4, num_attention_heads=64, num_key_value_heads=8,
        head_dim=64, sliding_window=128, rms_norm_eps=1e-5, vocab_size=201088, rope_theta=150000,
        rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                          original_max_position_embeddings=4096, truncate=False),
        layer_types=["sliding_attention", "full_attention"] * 12, swiglu_limit=7.0,
        max_position_embeddings=131072, tie_word_embeddings=False,
    ),
    # google/gemma-4-26b-a4b's text model (the hyperparameters of llama.cpp's
    # models/ggml-vocab-gemma-4.gguf): five sliding layers then one full, 128 experts of 704 (8 per
    # token) beside a dense MLP, full layers' values their keys.
    "gemma-4-26b-a4b": dict(
        model_type="gemma4_text", hidden_size=2816, num_hidden_layers=30, intermediate_size=2112,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, global_head_dim=512,
        num_global_key_value_heads=2, attention_k_eq_v=True, sliding_window=1024,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 5, enable_moe_block=True,
        num_experts=128, top_k_experts=8, moe_intermediate_size=704, num_kv_shared_layers=0,
        hidden_size_per_layer_input=0, vocab_size=262144, rms_norm_eps=1e-6,
        final_logit_softcapping=30.0, max_position_embeddings=262144, tie_word_embeddings=True,
        rope_parameters={
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    ),
}
# gpt-oss in its own format: the same shape, the experts in mxfp4 (see main).
CONFIGS["gpt-oss-20b-mxfp4"] = CONFIGS["gpt-oss-20b"]


def mxfp4_experts(path, _module):
    """mlx-community's MXFP4-Q8 layout: the experts mxfp4, the rest at quantize_model's 8 bits."""
    return {"group_size": 32, "bits": 4, "mode": "mxfp4"} if ".experts." in f"{path}." else True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", required=True, choices=CONFIGS)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json and tokenizer_config.json")
    a = ap.parse_args()

    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    config = dict(CONFIGS[a.arch])
    if a.layers:
        config["num_hidden_layers"] = a.layers
        if "layer_types" in config:
            config["layer_types"] = config["layer_types"][: a.layers]
    mx.random.seed(0)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.bfloat16)
    if a.arch.endswith("-mxfp4"):
        model, config = quantize_model(model, config, 64, 8, quant_predicate=mxfp4_experts)
        a.bits, a.group_size = "mxfp4/8", 32
    else:
        nn.quantize(model, group_size=a.group_size, bits=a.bits)
        config["quantization"] = {"group_size": a.group_size, "bits": a.bits, "mode": "affine"}
    mx.eval(model.parameters())
    out = Path(a.out)
    save_model(out, model, donate_model=True)
    save_config(config, out / "config.json")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(a.tokenizer) / f, out / f)
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    print(f"made {out}: {a.arch}, {config['num_hidden_layers']} layers, {a.bits}-bit g{a.group_size}, "
          f"{size / 1e9:.3f} GB of weights")


if __name__ == "__main__":
    main()
