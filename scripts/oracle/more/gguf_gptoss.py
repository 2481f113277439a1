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

import math
import sys

import gguf
import gguf_models as gm
import make_fixtures as fx
from gguf import GGMLQuantizationType as T

CASE = "gguf-gptoss"
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 128, 2, 4, 2, 32
EXPERTS, USED, EXPERT_FFN, VOCAB = 8, 2, 64, 49152
EPS, THETA, CONTEXT, WINDOW = 1e-5, 150000.0, 4096, 8
YARN = {"factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
ATTN_TYPES = {"attn_q": T.Q8_0, "attn_k": T.Q8_0, "attn_v": T.Q8_0, "attn_output": T.Q8_0}
EXPERT_TYPES = {"ffn_gate_exps": T.MXFP4, "ffn_up_exps": T.MXFP4, "ffn_down_exps": T.MXFP4}
SEED_TRIALS = 6


def model_tensors(seed):
    """GGUF tensors {name: (data, qtype or None)} and the dense MLX-named f32 weights."""
    t = gm.Tensors(seed)
    t.untied_q8_embeddings(VOCAB, HIDDEN)
    attn_shapes = gm.attention_shapes(HIDDEN, HEADS, KV_HEADS, HEAD_DIM)
    expert_shapes = gm.expert_shapes(EXPERTS, EXPERT_FFN, HIDDEN)
    def bias(shape):
        return 0.1 * t.rng.standard_normal(shape)

    for i in range(LAYERS):
        p = f"model.layers.{i}"
        t.norm(f"blk.{i}.attn_norm.weight", f"{p}.input_layernorm.weight", HIDDEN)
        t.norm(f"blk.{i}.post_attention_norm.weight", f"{p}.post_attention_layernorm.weight", HIDDEN)
        t.f32(f"blk.{i}.attn_sinks.weight", f"{p}.self_attn.sinks", t.rng.standard_normal(HEADS))
        for part, qtype in ATTN_TYPES.items():
            rows, cols = attn_shapes[part]
            name = f"{p}.{fx.GGUF_NAMES[part]}"
            t.matrix(f"blk.{i}.{part}.weight", f"{name}.weight", qtype, (rows, cols), 2.5 / math.sqrt(cols))
            t.f32(f"blk.{i}.{part}.bias", f"{name}.bias", bias(rows))
        t.f32(f"blk.{i}.ffn_gate_inp.weight", f"{p}.mlp.router.weight",
              1.5 / math.sqrt(HIDDEN) * t.rng.standard_normal((EXPERTS, HIDDEN)))
        t.f32(f"blk.{i}.ffn_gate_inp.bias", f"{p}.mlp.router.bias", bias(EXPERTS))
        for part, qtype in EXPERT_TYPES.items():
            shape = expert_shapes[part]
            name = f"{p}.mlp.experts.{gm.EXPERT_NAMES[part]}"
            t.matrix(f"blk.{i}.{part}.weight", f"{name}.weight", qtype, shape, 2.5 / math.sqrt(shape[-1]))
            t.f32(f"blk.{i}.{part}.bias", f"{name}.bias", bias(shape[:2]))
    return t.gguf, t.dense


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
        **gm.closing_fields(reader, VOCAB),
    }


def write_model_gguf(path, tensors, reader):
    hp = dict(context=CONTEXT, hidden=HIDDEN, layers=LAYERS, ffn=EXPERT_FFN, heads=HEADS, kv_heads=KV_HEADS,
              head_dim=HEAD_DIM, theta=THETA, eps=EPS, experts=(EXPERTS, USED, EXPERT_FFN), vocab=VOCAB,
              file_type=gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    w = gm.writer(path, "gpt-oss", "random gpt-oss", hp, reader)
    w.add_sliding_window(WINDOW)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(YARN["factor"])
    w.add_rope_scaling_orig_ctx_len(YARN["original_max_position_embeddings"])
    gm.write_tensors(w, tensors)


def main():
    gm.main(__doc__, CASE, model_tensors, dense_config, write_model_gguf, SEED_TRIALS,
            "mlx-lm on the dense f32 checkpoint of gguf-py's dequantized weights")


if __name__ == "__main__":
    sys.exit(main())
