"""A Llama 3.1 GGUF (`rope_freqs`: the per-pair rope factors llama.cpp's converter writes for
Llama 3's rope scaling), and what mlx-lm answers on the same weights with that scaling.

    gguf_llama31.py FIXTURES --tokenizers DIR --gguf FILE

Writes FIXTURES/gguf-llama31/:

- model.gguf: a tiny llama (hidden 256, 2 layers, 4 query heads over 2 kv heads, head_dim 64,
  FFN 512, untied Q8_0 head) as convert_hf_to_gguf writes Llama 3.1: q/k rows permuted, matrices
  in Q8_0/Q4_0/Q4_1, and `rope_freqs.weight` (F32, one factor per rotated pair) computed by the
  converter's own loop from rope_scaling {llama3, factor 8, low 1, high 4, original context 32},
  theta 10000. The original context is 32 rather than Llama 3.1's 8192 so that the recorded
  positions already turn by the scaled periods (five pairs blended, the rest of the long ones
  scaled by 8), SmolLM2's vocabulary and tokenizer metadata copied from --gguf.
- oracle.json / oracle.safetensors: mlx-lm's greedy run on the dense f32 checkpoint of exactly
  gguf-py's dequantized weights (q/k un-permuted) with that rope_scaling in its config.
"""

import math
import sys

import gguf
import gguf_models as gm
import make_fixtures as fx
import numpy as np
from gguf import GGMLQuantizationType as T

CASE = "gguf-llama31"
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 256, 2, 4, 2, 64, 512, 49152
EPS, THETA, CONTEXT = 1e-5, 10000.0, 4096
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 32}
TYPES = {"attn_q": T.Q8_0, "attn_k": T.Q4_0, "attn_v": T.Q4_1, "attn_output": T.Q8_0,
         "ffn_gate": T.Q4_0, "ffn_up": T.Q8_0, "ffn_down": T.Q4_1}
SEED_TRIALS = 6


def rope_factors():
    """convert_hf_to_gguf's LlamaModel.generate_extra_tensors for rope_type llama3 (its torch
    float32 frequencies, Python floats after)."""
    freqs = 1.0 / (np.float32(THETA) ** (np.arange(0, HEAD_DIM, 2, dtype=np.float32) / np.float32(HEAD_DIM)))
    factor, low, high = SCALING["factor"], SCALING["low_freq_factor"], SCALING["high_freq_factor"]
    old = SCALING["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / float(freq)
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def model_tensors(seed):
    """GGUF tensors {name: (data, qtype or None)} and the dense MLX-named f32 weights."""
    t = gm.Tensors(seed)
    t.untied_q8_embeddings(VOCAB, HIDDEN)
    t.gguf["rope_freqs.weight"] = (rope_factors(), None)
    shapes = gm.attention_shapes(HIDDEN, HEADS, KV_HEADS, HEAD_DIM)
    shapes.update({"ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)})
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        t.norm(f"blk.{i}.attn_norm.weight", f"{p}.input_layernorm.weight", HIDDEN)
        t.norm(f"blk.{i}.ffn_norm.weight", f"{p}.post_attention_layernorm.weight", HIDDEN)
        for part, qtype in TYPES.items():
            rows, cols = shapes[part]
            name = f"{p}.{fx.GGUF_NAMES[part]}.weight"
            t.matrix(f"blk.{i}.{part}.weight", name, qtype, (rows, cols), 2.5 / math.sqrt(cols))
            # The file holds q/k rows permuted (convert_hf_to_gguf); the dense checkpoint the
            # original order.
            heads = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(part)
            if heads:
                t.dense[name] = fx.unpermute_rows(t.dense[name], heads)
    return t.gguf, t.dense


def dense_config(reader):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "intermediate_size": FFN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "rms_norm_eps": EPS,
        "rope_theta": THETA,
        "rope_scaling": SCALING,
        "max_position_embeddings": CONTEXT,
        **gm.closing_fields(reader, VOCAB),
    }


def write_model_gguf(path, tensors, reader):
    hp = dict(context=CONTEXT, hidden=HIDDEN, layers=LAYERS, ffn=FFN, heads=HEADS, kv_heads=KV_HEADS,
              head_dim=HEAD_DIM, theta=THETA, eps=EPS, vocab=VOCAB, file_type=gguf.LlamaFileType.MOSTLY_Q8_0)
    w = gm.writer(path, "llama", "random Llama 3.1", hp, reader)
    w.add_rope_dimension_count(HEAD_DIM)
    gm.write_tensors(w, tensors)


def main():
    gm.main(__doc__, CASE, model_tensors, dense_config, write_model_gguf, SEED_TRIALS,
            "mlx-lm on the dense f32 checkpoint of gguf-py's dequantized weights, rope_scaling llama3")


if __name__ == "__main__":
    sys.exit(main())
