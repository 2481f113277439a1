"""GGUFs of llama.cpp's `qwen35` and `qwen35moe` architectures (the Qwen3.5 hybrids), and what
mlx-lm answers on the same weights.

    gguf_qwen35.py FIXTURES --tokenizers DIR --gguf FILE

Writes FIXTURES/gguf-qwen35/ and FIXTURES/gguf-qwen35moe/, each:

- model.gguf: a tiny Qwen3.5 (hidden 128, 4 layers: Gated DeltaNet linear attention except every
  second layer, which is gated full attention with a quarter of each 32-wide head rotated; 2 key
  heads and 4 value heads of 32 in the linear layers) written as llama.cpp's converter
  (conversion/qwen.py, Qwen3_5TextModel / Qwen3_5MoeTextModel) writes one: `ssm_a` holds
  -exp(A_log), `ssm_dt.bias` the dt bias, `ssm_conv1d` the convolution squeezed to [channels,
  kernel], the norms as mlx-lm stores them (1 + w), and the value heads of every linear-attention
  tensor reordered from grouped by key head to tiled (`_reorder_v_heads`: the V rows of
  `attn_qkv`, the rows of `attn_gate`, `ssm_alpha`, `ssm_beta`, the entries of `ssm_a` and
  `ssm_dt`, the V channels of `ssm_conv1d`, the columns of `ssm_out`); projections in Q8_0, Q5_0,
  Q4_1 and Q4_0 (`ssm_out` in Q8_0, whose blocks of 32 the head width keeps whole), the rest F32;
  full_attention_interval 2 and the recurrent-layer flags as the converter writes them from
  `layer_types`. `qwen35moe`: every layer's feed-forward is 8 experts of 64 (2 per token, stacked
  3-D tensors) plus a shared expert of 64 under its sigmoid gate (`ffn_gate_inp_shexp`). SmolLM2's
  vocabulary and tokenizer metadata copied from --gguf.
- oracle.json / oracle.safetensors: mlx-lm's greedy run on the dense f32 checkpoint of gguf-py's
  dequantized weights in Hugging Face's head order (`qwen3_5` / `qwen3_5_moe`, mlx-lm's layout),
  recorded like every other case. There is no config.json, so the parity suite skips it.
"""

import math
import sys

import gguf
import gguf_models as gm
import numpy as np
from gguf import GGMLQuantizationType as T

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERVAL = 128, 4, 4, 2, 32, 2
K_HEADS, V_HEADS, K_DIM, V_DIM, CONV = 2, 4, 32, 32, 4
FFN, EXPERTS, USED, EXPERT_FFN, SHARED_FFN, VOCAB = 256, 8, 2, 64, 64, 49152
EPS, THETA, CONTEXT, ROTARY = 1e-6, 10000000.0, 4096, 0.25
SECTIONS = [2, 1, 1]
SEED_TRIALS = 10


def reorder(x, axis, unit):
    """llama.cpp's `_reorder_v_heads`: the value heads along `axis` (each `unit` wide) from grouped
    by key head (HF: key head g's heads g r .. g r + r - 1) to tiled (head j of every key head, then
    head j + 1)."""
    x = np.moveaxis(x, axis, 0)
    shape = x.shape
    x = x.reshape(K_HEADS, V_HEADS // K_HEADS, unit, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.moveaxis(x, 0, axis)


def grouped(x, axis, unit):
    """The inverse of `reorder`: tiled value heads back to Hugging Face's grouped order."""
    x = np.moveaxis(x, axis, 0)
    shape = x.shape
    x = x.reshape(V_HEADS // K_HEADS, K_HEADS, unit, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.moveaxis(x, 0, axis)


def linear_attention(t, i, p):
    """Layer i's Gated DeltaNet tensors: the file's in tiled head order, the dense ones grouped."""
    key_dim, value_dim = K_HEADS * K_DIM, V_HEADS * V_DIM
    conv_dim = 2 * key_dim + value_dim
    la = f"{p}.linear_attn"
    # attn_qkv: q and k rows as they are, the V rows tiled.
    t.matrix(f"blk.{i}.attn_qkv.weight", f"{la}.in_proj_qkv.weight", T.Q8_0, (conv_dim, HIDDEN), 2.5 / math.sqrt(HIDDEN))
    qkv = t.dense[f"{la}.in_proj_qkv.weight"]
    qkv[2 * key_dim:] = grouped(qkv[2 * key_dim:], 0, V_DIM)
    t.matrix(f"blk.{i}.attn_gate.weight", f"{la}.in_proj_z.weight", T.Q4_1, (value_dim, HIDDEN), 2.5 / math.sqrt(HIDDEN))
    t.dense[f"{la}.in_proj_z.weight"] = grouped(t.dense[f"{la}.in_proj_z.weight"], 0, V_DIM)
    for gname, hname in (("ssm_alpha", "in_proj_a"), ("ssm_beta", "in_proj_b")):
        values = (1.5 / math.sqrt(HIDDEN) * t.rng.standard_normal((V_HEADS, HIDDEN))).astype(np.float32)
        t.gguf[f"blk.{i}.{gname}.weight"] = (values, None)
        t.dense[f"{la}.{hname}.weight"] = grouped(values, 0, 1)
    a_log = np.log(t.rng.uniform(1.0, 16.0, V_HEADS)).astype(np.float32)
    t.gguf[f"blk.{i}.ssm_a"] = (reorder(-np.exp(a_log), 0, 1).astype(np.float32), None)
    t.dense[f"{la}.A_log"] = a_log
    dt_bias = (0.5 * t.rng.standard_normal(V_HEADS)).astype(np.float32)
    t.gguf[f"blk.{i}.ssm_dt.bias"] = (reorder(dt_bias, 0, 1), None)
    t.dense[f"{la}.dt_bias"] = dt_bias
    conv = (0.5 * t.rng.standard_normal((conv_dim, CONV))).astype(np.float32)
    t.dense[f"{la}.conv1d.weight"] = conv[:, :, None]  # mlx-lm's [channels, kernel, 1]
    conv_file = conv.copy()
    conv_file[2 * key_dim:] = reorder(conv[2 * key_dim:], 0, V_DIM)
    t.gguf[f"blk.{i}.ssm_conv1d.weight"] = (conv_file, None)
    t.norm(f"blk.{i}.ssm_norm.weight", f"{la}.norm.weight", V_DIM)
    # ssm_out: the columns tiled.
    t.matrix(f"blk.{i}.ssm_out.weight", f"{la}.out_proj.weight", T.Q8_0, (HIDDEN, value_dim), 2.5 / math.sqrt(value_dim))
    t.dense[f"{la}.out_proj.weight"] = grouped(t.dense[f"{la}.out_proj.weight"], 1, V_DIM)


def full_attention(t, i, p):
    """Layer i's gated full attention (q_proj's rows hold each head's query, then its gate)."""
    sa = f"{p}.self_attn"
    for gname, hname, qtype, shape in (
        ("attn_q", "q_proj", T.Q8_0, (2 * HEADS * HEAD_DIM, HIDDEN)),
        ("attn_k", "k_proj", T.Q5_0, (KV_HEADS * HEAD_DIM, HIDDEN)),
        ("attn_v", "v_proj", T.Q4_1, (KV_HEADS * HEAD_DIM, HIDDEN)),
        ("attn_output", "o_proj", T.Q8_0, (HIDDEN, HEADS * HEAD_DIM)),
    ):
        t.matrix(f"blk.{i}.{gname}.weight", f"{sa}.{hname}.weight", qtype, shape, 2.5 / math.sqrt(shape[1]))
    t.norm(f"blk.{i}.attn_q_norm.weight", f"{sa}.q_norm.weight", HEAD_DIM)
    t.norm(f"blk.{i}.attn_k_norm.weight", f"{sa}.k_norm.weight", HEAD_DIM)


def feed_forward(t, i, p, moe):
    if not moe:
        for gname, hname, qtype, shape in (("ffn_gate", "gate_proj", T.Q4_0, (FFN, HIDDEN)),
                                           ("ffn_up", "up_proj", T.Q8_0, (FFN, HIDDEN)),
                                           ("ffn_down", "down_proj", T.Q4_1, (HIDDEN, FFN))):
            t.matrix(f"blk.{i}.{gname}.weight", f"{p}.mlp.{hname}.weight", qtype, shape, 2.5 / math.sqrt(shape[1]))
        return
    t.f32(f"blk.{i}.ffn_gate_inp.weight", f"{p}.mlp.gate.weight",
          1.5 / math.sqrt(HIDDEN) * t.rng.standard_normal((EXPERTS, HIDDEN)))
    for part, qtype in (("ffn_gate_exps", T.Q4_0), ("ffn_up_exps", T.Q8_0), ("ffn_down_exps", T.Q4_1)):
        shape = gm.expert_shapes(EXPERTS, EXPERT_FFN, HIDDEN)[part]
        t.matrix(f"blk.{i}.{part}.weight", f"{p}.mlp.switch_mlp.{gm.EXPERT_NAMES[part]}.weight", qtype, shape,
                 2.5 / math.sqrt(shape[-1]))
    for gname, hname, qtype, shape in (("ffn_gate_shexp", "gate_proj", T.Q8_0, (SHARED_FFN, HIDDEN)),
                                       ("ffn_up_shexp", "up_proj", T.Q4_0, (SHARED_FFN, HIDDEN)),
                                       ("ffn_down_shexp", "down_proj", T.Q8_0, (HIDDEN, SHARED_FFN))):
        t.matrix(f"blk.{i}.{gname}.weight", f"{p}.mlp.shared_expert.{hname}.weight", qtype, shape,
                 2.5 / math.sqrt(shape[1]))
    gate = (1.5 / math.sqrt(HIDDEN) * t.rng.standard_normal(HIDDEN)).astype(np.float32)
    t.gguf[f"blk.{i}.ffn_gate_inp_shexp.weight"] = (gate, None)  # llama.cpp's {n_embd}
    t.dense[f"{p}.mlp.shared_expert_gate.weight"] = gate[None, :]


def recurrent(i):
    return (i + 1) % INTERVAL != 0


def tensors_for(moe):
    def model_tensors(seed):
        t = gm.Tensors(seed)
        t.untied_q8_embeddings(VOCAB, HIDDEN)
        for i in range(LAYERS):
            p = f"model.layers.{i}"
            t.norm(f"blk.{i}.attn_norm.weight", f"{p}.input_layernorm.weight", HIDDEN)
            t.norm(f"blk.{i}.post_attention_norm.weight", f"{p}.post_attention_layernorm.weight", HIDDEN)
            (linear_attention if recurrent(i) else full_attention)(t, i, p)
            feed_forward(t, i, p, moe)
        return t.gguf, t.dense
    return model_tensors


def config_for(moe):
    def dense_config(reader):
        config = {
            "architectures": ["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_moe" if moe else "qwen3_5",
            "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS,
            "intermediate_size": FFN,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "full_attention_interval": INTERVAL,
            "linear_conv_kernel_dim": CONV,
            "linear_key_head_dim": K_DIM,
            "linear_num_key_heads": K_HEADS,
            "linear_num_value_heads": V_HEADS,
            "linear_value_head_dim": V_DIM,
            "rms_norm_eps": EPS,
            "rope_parameters": {"mrope_section": SECTIONS, "mrope_interleaved": True, "rope_theta": THETA,
                                "partial_rotary_factor": ROTARY, "type": "default"},
            "max_position_embeddings": CONTEXT,
            **gm.closing_fields(reader, VOCAB),
        }
        if moe:
            # llama.cpp renormalizes qwen35moe's top-k (build_moe_ffn's norm_w) whatever the
            # original config said.
            config.update(num_experts=EXPERTS, num_experts_per_tok=USED, moe_intermediate_size=EXPERT_FFN,
                          shared_expert_intermediate_size=SHARED_FFN, norm_topk_prob=True)
        return config
    return dense_config


def writer_for(moe, mtp_layers=0):
    """Writes the file; with `mtp_layers`, that many multi-token-prediction blocks follow the
    decoder's (block_count counts them, nextn_predict_layers says how many, none recurrent), as
    llama.cpp's converter writes an original's `mtp.*`."""
    def write_model_gguf(path, tensors, reader):
        blocks = LAYERS + mtp_layers
        hp = dict(context=CONTEXT, hidden=HIDDEN, layers=blocks, ffn=FFN, heads=HEADS, kv_heads=KV_HEADS,
                  head_dim=HEAD_DIM, theta=THETA, eps=EPS, vocab=VOCAB, file_type=gguf.LlamaFileType.MOSTLY_Q8_0)
        if moe:
            hp["experts"] = (EXPERTS, USED, EXPERT_FFN)
        w = gm.writer(path, "qwen35moe" if moe else "qwen35", "random Qwen3.5", hp, reader)
        if moe:
            w.add_expert_shared_feed_forward_length(SHARED_FFN)
        w.add_ssm_conv_kernel(CONV)
        w.add_ssm_state_size(K_DIM)
        w.add_ssm_group_count(K_HEADS)
        w.add_ssm_time_step_rank(V_HEADS)
        w.add_ssm_inner_size(V_DIM * V_HEADS)
        # The keys by name: the oracle's gguf-py predates their writer methods.
        w.add_array(f"{w.arch}.attention.recurrent_layers",
                    [recurrent(i) and i < LAYERS for i in range(blocks)])
        if mtp_layers:
            w.add_uint32(f"{w.arch}.nextn_predict_layers", mtp_layers)
        w.add_uint32(f"{w.arch}.full_attention_interval", INTERVAL)
        w.add_rope_dimension_count(int(HEAD_DIM * ROTARY))
        w.add_rope_dimension_sections(SECTIONS + [0])
        gm.write_tensors(w, tensors)
    return write_model_gguf


def main():
    for case, moe in (("gguf-qwen35", False), ("gguf-qwen35moe", True)):
        gm.main(__doc__, case, tensors_for(moe), config_for(moe), writer_for(moe), SEED_TRIALS,
                "mlx-lm on the dense f32 checkpoint of gguf-py's dequantized weights, value heads grouped")


if __name__ == "__main__":
    sys.exit(main())
