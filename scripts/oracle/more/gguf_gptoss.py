"""A GGUF of llama.cpp's `gpt-oss` architecture, and what mlx-lm answers on the same weights.

    gguf_gptoss.py FIXTURES --tokenizers DIR --gguf FILE

Writes FIXTURES/gguf-gptoss/:

- model.gguf: a tiny gpt-oss (hidden 128, 2 layers: sliding window 8 then full attention, 4 query
  heads over 2 kv heads, head_dim 32, q/k/v/o biases, attention sinks, yarn rope, 8 experts of
  64, 2 per token, router and expert biases, untied output) named and shaped as llama.cpp's
  converter writes one: experts stacked in 3-D MXFP4 tensors (ggml type 39, as the gpt-oss
  releases ship them), their biases [experts, width] in F32, the router `ffn_gate_inp` in F32,
  attention and embeddings in Q8_0; SmolLM2's vocabulary and tokenizer metadata copied from --gguf.
- oracle.json / oracle.safetensors: mlx-lm's greedy run on the dense f32 checkpoint of exactly
  gguf-py's dequantized weights (`gpt_oss`, experts as `mlp.experts.*_proj`), recorded like every
  other case. There is no config.json, so the parity suite skips it.
"""

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import gguf
import gguf_models as gm
import make_fixtures as fx
import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

CASE = "gguf-gptoss"
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 128, 2, 4, 2, 32
EXPERTS, USED, EXPERT_FFN, VOCAB = 8, 2, 64, 49152
EPS, THETA, CONTEXT, WINDOW = 1e-5, 150000.0, 4096, 8
YARN = {"factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
ATTN_TYPES = {"attn_q": T.Q8_0, "attn_k": T.Q8_0, "attn_v": T.Q8_0, "attn_output": T.Q8_0}
EXPERT_TYPES = {"ffn_gate_exps": T.MXFP4, "ffn_up_exps": T.MXFP4, "ffn_down_exps": T.MXFP4}
EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
SEED_TRIALS = 6


def quantized(rng, qtype, shape, std):
    """(bytes as the GGUF holds them, gguf-py's f32 values), for any leading shape."""
    data = quantize((std * rng.standard_normal(shape)).astype(np.float32), qtype)
    values = dequantize(data, qtype).astype(np.float32)
    assert values.shape == tuple(shape)
    return data, values


def model_tensors(seed):
    """GGUF tensors {name: (data, qtype or None)} and the dense MLX-named f32 weights."""
    rng = np.random.default_rng(seed)
    gguf_t, dense = {}, {}

    def norm(gname, hname, n):
        v = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        gguf_t[gname] = (v, None)
        dense[hname] = v

    data, values = quantized(rng, T.Q8_0, (VOCAB, HIDDEN), 0.2)
    gguf_t["token_embd.weight"] = (data, T.Q8_0)
    dense["model.embed_tokens.weight"] = values
    # A wide head: logits spread enough that 64 greedy steps keep clear top-2 gaps.
    data, values = quantized(rng, T.Q8_0, (VOCAB, HIDDEN), 4.0 / math.sqrt(HIDDEN))
    gguf_t["output.weight"] = (data, T.Q8_0)
    dense["lm_head.weight"] = values
    norm("output_norm.weight", "model.norm.weight", HIDDEN)
    attn_shapes = {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
                   "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HEADS * HEAD_DIM)}
    expert_shapes = {"ffn_gate_exps": (EXPERTS, EXPERT_FFN, HIDDEN), "ffn_up_exps": (EXPERTS, EXPERT_FFN, HIDDEN),
                     "ffn_down_exps": (EXPERTS, HIDDEN, EXPERT_FFN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        norm(f"blk.{i}.attn_norm.weight", f"{p}.input_layernorm.weight", HIDDEN)
        norm(f"blk.{i}.post_attention_norm.weight", f"{p}.post_attention_layernorm.weight", HIDDEN)
        sinks = rng.standard_normal(HEADS).astype(np.float32)
        gguf_t[f"blk.{i}.attn_sinks.weight"] = (sinks, None)
        dense[f"{p}.self_attn.sinks"] = sinks
        for part, qtype in ATTN_TYPES.items():
            rows, cols = attn_shapes[part]
            data, values = quantized(rng, qtype, (rows, cols), 2.5 / math.sqrt(cols))
            gguf_t[f"blk.{i}.{part}.weight"] = (data, qtype)
            dense[f"{p}.{fx.GGUF_NAMES[part]}.weight"] = values
            bias = (0.1 * rng.standard_normal(rows)).astype(np.float32)
            gguf_t[f"blk.{i}.{part}.bias"] = (bias, None)
            dense[f"{p}.{fx.GGUF_NAMES[part]}.bias"] = bias
        router = (1.5 / math.sqrt(HIDDEN) * rng.standard_normal((EXPERTS, HIDDEN))).astype(np.float32)
        router_bias = (0.1 * rng.standard_normal(EXPERTS)).astype(np.float32)
        gguf_t[f"blk.{i}.ffn_gate_inp.weight"] = (router, None)
        gguf_t[f"blk.{i}.ffn_gate_inp.bias"] = (router_bias, None)
        dense[f"{p}.mlp.router.weight"] = router
        dense[f"{p}.mlp.router.bias"] = router_bias
        for part, qtype in EXPERT_TYPES.items():
            shape = expert_shapes[part]
            data, values = quantized(rng, qtype, shape, 2.5 / math.sqrt(shape[-1]))
            gguf_t[f"blk.{i}.{part}.weight"] = (data, qtype)
            dense[f"{p}.mlp.experts.{EXPERT_NAMES[part]}.weight"] = values
            bias = (0.1 * rng.standard_normal(shape[:2])).astype(np.float32)
            gguf_t[f"blk.{i}.{part}.bias"] = (bias, None)
            dense[f"{p}.mlp.experts.{EXPERT_NAMES[part]}.bias"] = bias
    return gguf_t, dense


def dense_config(reader):
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "intermediate_size": EXPERT_FFN,
        "num_local_experts": EXPERTS,
        "num_experts_per_tok": USED,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention"],
        "rms_norm_eps": EPS,
        "rope_theta": THETA,
        "rope_scaling": dict(YARN, rope_type="yarn"),
        "max_position_embeddings": CONTEXT,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "bos_token_id": int(fx.gguf_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(fx.gguf_field(reader, "tokenizer.ggml.eos_token_id")),
        "torch_dtype": "float32",
    }


def write_dense(ref, dense, reader):
    ref.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(ref / "model.safetensors"), {k: mx.array(v) for k, v in dense.items()},
                        metadata={"format": "mlx"})
    (ref / "config.json").write_text(json.dumps(dense_config(reader), indent=4))
    fx.write_gguf_tokenizer(reader, ref)


def write_model_gguf(path, tensors, reader):
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_name("random gpt-oss")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(EXPERT_FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(THETA)
    w.add_layer_norm_rms_eps(EPS)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(USED)
    w.add_expert_feed_forward_length(EXPERT_FFN)
    w.add_sliding_window(WINDOW)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(YARN["factor"])
    w.add_rope_scaling_orig_ctx_len(YARN["original_max_position_embeddings"])
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    gm.add_smollm_tokenizer(w, reader)
    gm.write_tensors(w, tensors)


def make_model(case_dir, reader, work):
    return gm.record_best_seed(CASE, case_dir, reader, work, model_tensors, write_dense, write_model_gguf,
                               SEED_TRIALS, "mlx-lm on the dense f32 checkpoint of gguf-py's dequantized weights")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fixtures", type=Path)
    ap.add_argument("--tokenizers", type=Path)
    ap.add_argument("--gguf", type=Path, required=True)
    args = ap.parse_args()
    mx.random.seed(0)
    case_dir = args.fixtures.resolve() / CASE
    shutil.rmtree(case_dir, ignore_errors=True)
    case_dir.mkdir(parents=True)
    reader = gguf.GGUFReader(str(args.gguf))
    with tempfile.TemporaryDirectory() as tmp:
        record = make_model(case_dir, reader, Path(tmp))
    print(f"[{CASE}] min margin {record['min_margin']:.3f}, tokens {record['greedy_tokens'][:8]}...", flush=True)


if __name__ == "__main__":
    sys.exit(main())
