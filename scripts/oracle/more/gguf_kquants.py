"""GGUF K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): what their blocks mean, and a model made of them.

    gguf_kquants.py FIXTURES --tokenizers DIR --gguf FILE

Writes FIXTURES/gguf-kquants/:

- blocks.gguf: one tensor per K-quant type (8 rows of 512 values = 16 super-blocks), packed parts
  random bytes, f16 d/dmin random over many magnitudes (subnormal, zero, negative, large
  included); blocks.safetensors: gguf-py's own dequantization of each (f32, [rows, cols]), the
  values llama.cpp computes.
- model.gguf: a tiny llama (hidden 256, 2 layers, 4 query heads over 2 kv heads, head_dim 64,
  FFN 512, SmolLM2's vocabulary and tokenizer metadata copied from --gguf, tied embeddings)
  whose matrices mix every K-quant with Q8_0 (F32 norms), q/k rows in llama.cpp's permuted
  order as convert_hf_to_gguf writes them. K-quant bytes are random; each super-block's d (and
  dmin) is chosen so its values have mean ~0 and a trained model's spread.
- oracle.json / oracle.safetensors: mlx-lm's greedy run on the dense f32 checkpoint of exactly
  gguf-py's dequantized weights (q/k rows un-permuted), recorded like every other case
  (make_fixtures.record_plain_prompt). There is no config.json, so the parity suite skips it.

MLX has no equivalent of groups of 16 (mx.quantize accepts 32, 64, 128), so the dense
checkpoint, not an MLX quantized one, is the oracle.
"""

import math
import sys

import gguf
import gguf_models as gm
import make_fixtures as fx
import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

CASE = "gguf-kquants"
KQUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
# Byte offsets of the f16 d and dmin in each super-block (dmin None: the type has none).
D_AT = {T.Q2_K: (80, 82), T.Q3_K: (108, None), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208, None)}

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 256, 2, 4, 2, 64, 512
EPS, THETA, CONTEXT = 1e-5, 10000.0, 4096
# Per layer, the type of each matrix: every K-quant on q and k (llama.cpp permutes their rows),
# groups of 16 and 32 side by side, and Q8_0 for a simple type in the mix.
LAYER_TYPES = [
    {"attn_q": T.Q4_K, "attn_k": T.Q6_K, "attn_v": T.Q3_K, "attn_output": T.Q5_K,
     "ffn_gate": T.Q2_K, "ffn_up": T.Q4_K, "ffn_down": T.Q6_K},
    {"attn_q": T.Q2_K, "attn_k": T.Q5_K, "attn_v": T.Q6_K, "attn_output": T.Q4_K,
     "ffn_gate": T.Q3_K, "ffn_up": T.Q5_K, "ffn_down": T.Q8_0},
]
EMBED_TYPE = T.Q6_K
SEED_TRIALS = 4


def block_bytes(qtype):
    return gguf.GGML_QUANT_SIZES[qtype][1]


def set_f16(blocks, at, values):
    blocks[:, at:at + 2] = np.asarray(values, dtype=np.float16).reshape(-1, 1).view(np.uint8)


def random_blocks(rng, qtype, n):
    return rng.integers(0, 256, size=(n, block_bytes(qtype)), dtype=np.uint8)


# --------------------------------------------------------------------------
# block-level records


def random_scales(rng, n):
    """f16 values over many magnitudes, both signs, with zeros, subnormals and large ones."""
    v = np.sign(rng.standard_normal(n)) * 10.0 ** rng.uniform(-7, 1, n)
    v[:4] = [0.0, -0.0, 3e-7, 60000.0]  # zero, negative zero, subnormal, near the f16 maximum
    return rng.permutation(v).astype(np.float16)


def make_blocks(case_dir, rng):
    rows, cols = 8, 512
    w = gguf.GGUFWriter(str(case_dir / "blocks.gguf"), "llama")
    values = {}
    for qtype in KQUANTS:
        n = rows * cols // 256
        blocks = random_blocks(rng, qtype, n)
        d_at, dmin_at = D_AT[qtype]
        set_f16(blocks, d_at, random_scales(rng, n))
        if dmin_at is not None:
            set_f16(blocks, dmin_at, random_scales(rng, n))
        data = blocks.reshape(rows, -1)
        name = qtype.name.lower()
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
        values[name] = dequantize(data, qtype).astype(np.float32)
        assert values[name].shape == (rows, cols) and np.isfinite(values[name]).all()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    mx.save_safetensors(str(case_dir / "blocks.safetensors"), {k: mx.array(v) for k, v in values.items()})


# --------------------------------------------------------------------------
# the model


def kquant_matrix(rng, qtype, rows, cols, std):
    """Random K-quant bytes whose values have mean ~0 and standard deviation ~std per super-block.

    Dequantization is linear in (d, dmin): w = d*A - dmin*B, with A and B read off by
    dequantizing with (1, 0) and (0, 1)."""
    n = rows * cols // 256
    blocks = random_blocks(rng, qtype, n)
    d_at, dmin_at = D_AT[qtype]

    def values(d, dmin):
        b = blocks.copy()
        set_f16(b, d_at, np.full(n, d))
        if dmin_at is not None:
            set_f16(b, dmin_at, np.full(n, dmin))
        return dequantize(b, qtype).reshape(n, 256).astype(np.float64)

    a = values(1.0, 0.0)
    if dmin_at is None:
        d = std / np.maximum(a.std(axis=1), 1e-3)
        set_f16(blocks, d_at, d)
    else:
        b = -values(0.0, 1.0)
        ratio = a.mean(axis=1) / np.maximum(b.mean(axis=1), 1e-3)
        d = std / np.maximum((a - ratio[:, None] * b).std(axis=1), 1e-3)
        set_f16(blocks, d_at, d)
        set_f16(blocks, dmin_at, d * ratio)
    return blocks.reshape(rows, -1)


def matrix(rng, qtype, rows, cols, std):
    """(bytes as the GGUF holds them [rows, row bytes], gguf-py's f32 values [rows, cols])."""
    if qtype == T.Q8_0:
        data = quantize((std * rng.standard_normal((rows, cols))).astype(np.float32), qtype)
    else:
        data = kquant_matrix(rng, qtype, rows, cols, std)
    return data, dequantize(data, qtype).astype(np.float32)


def model_tensors(seed):
    """GGUF tensors {name: (data, qtype or None)} and the dense HF-named f32 weights."""
    rng = np.random.default_rng(seed)
    gguf_t, dense = {}, {}

    def norm(gname, hname, n):
        v = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        gguf_t[gname] = (v, None)
        dense[hname] = v

    data, values = matrix(rng, EMBED_TYPE, 49152, HIDDEN, 0.2)
    gguf_t["token_embd.weight"] = (data, EMBED_TYPE)
    dense["model.embed_tokens.weight"] = values
    norm("output_norm.weight", "model.norm.weight", HIDDEN)
    shapes = {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
              "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HEADS * HEAD_DIM),
              "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
    for i, types in enumerate(LAYER_TYPES):
        norm(f"blk.{i}.attn_norm.weight", f"model.layers.{i}.input_layernorm.weight", HIDDEN)
        norm(f"blk.{i}.ffn_norm.weight", f"model.layers.{i}.post_attention_layernorm.weight", HIDDEN)
        for part, qtype in types.items():
            rows, cols = shapes[part]
            # Residual branches larger than the embedding, as make_fixtures.random_weights.
            data, values = matrix(rng, qtype, rows, cols, 2.5 / math.sqrt(cols))
            gguf_t[f"blk.{i}.{part}.weight"] = (data, qtype)
            # The file holds q/k rows permuted (convert_hf_to_gguf); the dense checkpoint the
            # original order.
            heads = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(part)
            if heads:
                values = fx.unpermute_rows(values, heads)
            dense[f"model.layers.{i}.{fx.GGUF_NAMES[part]}.weight"] = values
    return gguf_t, dense


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
        "max_position_embeddings": CONTEXT,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "rope_traditional": False,
        "bos_token_id": int(fx.gguf_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(fx.gguf_field(reader, "tokenizer.ggml.eos_token_id")),
        "torch_dtype": "float32",
    }


def write_model_gguf(path, tensors, reader):
    hp = dict(context=CONTEXT, hidden=HIDDEN, layers=LAYERS, ffn=FFN, heads=HEADS, kv_heads=KV_HEADS, theta=THETA,
              eps=EPS, vocab=49152, file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M)
    gm.write_tensors(gm.writer(path, "llama", "random K-quant llama", hp, reader), tensors)


def main():
    gm.main(__doc__, CASE, model_tensors, dense_config, write_model_gguf, SEED_TRIALS,
            "mlx-lm on the dense f32 checkpoint of gguf-py's dequantized weights (q/k rows un-permuted)",
            before=lambda case_dir: make_blocks(case_dir, np.random.default_rng(2026)))


if __name__ == "__main__":
    sys.exit(main())
