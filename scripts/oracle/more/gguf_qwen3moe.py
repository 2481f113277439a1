"""A GGUF of llama.cpp's `qwen3moe` architecture, and what mlx-lm answers on the same weights.

    gguf_qwen3moe.py FIXTURES --tokenizers DIR --gguf FILE

Writes FIXTURES/gguf-qwen3moe/:

- model.gguf: a tiny Qwen3-MoE (hidden 128, 2 layers, 4 query heads over 2 kv heads, head_dim 32,
  q/k norms, 8 experts of 64, 2 per token, untied output) named and shaped as llama.cpp's
  converter writes one: the router `ffn_gate_inp` in F32, the experts stacked in 3-D tensors
  (`ffn_gate_exps`/`ffn_up_exps` [experts, 64, 128], `ffn_down_exps` [experts, 128, 64]) in Q4_0,
  Q8_0 and Q4_1, attention in Q8_0/Q5_0/Q4_1, SmolLM2's vocabulary and tokenizer metadata copied
  from --gguf.
- oracle.json / oracle.safetensors: mlx-lm's greedy run on the dense f32 checkpoint of exactly
  gguf-py's dequantized weights (`qwen3_moe`, experts stacked as `switch_mlp`, norm_topk_prob
  true as llama.cpp always renormalizes qwen3moe's top-k), recorded like every other case. There
  is no config.json, so the parity suite skips it.
"""

import math
import sys

import gguf
import gguf_models as gm
import make_fixtures as fx
from gguf import GGMLQuantizationType as T

CASE = "gguf-qwen3moe"
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 128, 2, 4, 2, 32
EXPERTS, USED, EXPERT_FFN, VOCAB = 8, 2, 64, 49152
EPS, THETA, CONTEXT = 1e-6, 1000000.0, 4096
ATTN_TYPES = {"attn_q": T.Q8_0, "attn_k": T.Q5_0, "attn_v": T.Q4_1, "attn_output": T.Q8_0}
EXPERT_TYPES = {"ffn_gate_exps": T.Q4_0, "ffn_up_exps": T.Q8_0, "ffn_down_exps": T.Q4_1}
SEED_TRIALS = 6


def model_tensors(seed):
    """GGUF tensors {name: (data, qtype or None)} and the dense MLX-named f32 weights."""
    t = gm.Tensors(seed)
    t.untied_q8_embeddings(VOCAB, HIDDEN)
    attn_shapes = gm.attention_shapes(HIDDEN, HEADS, KV_HEADS, HEAD_DIM)
    expert_shapes = gm.expert_shapes(EXPERTS, EXPERT_FFN, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        t.norm(f"blk.{i}.attn_norm.weight", f"{p}.input_layernorm.weight", HIDDEN)
        t.norm(f"blk.{i}.ffn_norm.weight", f"{p}.post_attention_layernorm.weight", HIDDEN)
        t.norm(f"blk.{i}.attn_q_norm.weight", f"{p}.self_attn.q_norm.weight", HEAD_DIM)
        t.norm(f"blk.{i}.attn_k_norm.weight", f"{p}.self_attn.k_norm.weight", HEAD_DIM)
        for part, qtype in ATTN_TYPES.items():
            rows, cols = attn_shapes[part]
            t.matrix(f"blk.{i}.{part}.weight", f"{p}.{fx.GGUF_NAMES[part]}.weight", qtype, (rows, cols),
                     2.5 / math.sqrt(cols))
        t.f32(f"blk.{i}.ffn_gate_inp.weight", f"{p}.mlp.gate.weight",
              1.5 / math.sqrt(HIDDEN) * t.rng.standard_normal((EXPERTS, HIDDEN)))
        for part, qtype in EXPERT_TYPES.items():
            shape = expert_shapes[part]
            t.matrix(f"blk.{i}.{part}.weight", f"{p}.mlp.switch_mlp.{gm.EXPERT_NAMES[part]}.weight", qtype, shape,
                     2.5 / math.sqrt(shape[-1]))
    return t.gguf, t.dense


def dense_config(reader):
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "intermediate_size": 4 * HIDDEN,
        "moe_intermediate_size": EXPERT_FFN,
        "num_experts": EXPERTS,
        "num_experts_per_tok": USED,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "rms_norm_eps": EPS,
        "rope_theta": THETA,
        "max_position_embeddings": CONTEXT,
        **gm.closing_fields(reader, VOCAB),
    }


def write_model_gguf(path, tensors, reader):
    hp = dict(context=CONTEXT, hidden=HIDDEN, layers=LAYERS, ffn=4 * HIDDEN, heads=HEADS, kv_heads=KV_HEADS,
              head_dim=HEAD_DIM, theta=THETA, eps=EPS, experts=(EXPERTS, USED, EXPERT_FFN), vocab=VOCAB,
              file_type=gguf.LlamaFileType.MOSTLY_Q8_0)
    w = gm.writer(path, "qwen3moe", "random Qwen3-MoE", hp, reader)
    gm.write_tensors(w, tensors)


def main():
    gm.main(__doc__, CASE, model_tensors, dense_config, write_model_gguf, SEED_TRIALS,
            "mlx-lm on the dense f32 checkpoint of gguf-py's dequantized weights")


if __name__ == "__main__":
    sys.exit(main())
