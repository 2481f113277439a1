"""A random-weight Qwen3-0.6B-architecture checkpoint as GGUF Q4_1, for bench/compare-cpu.

    make-qwen3-gguf.py OUT.gguf TOKENIZER_DIR

Both engines then read the same file: llama.cpp as Q4_1, nuvec converting each Q4_1 block
exactly to MLX's affine 4-bit groups of 32. The tokenizer (the npm Qwen3 tokenizer.json, padded
to the model's 151936 rows as convert_hf_to_gguf pads) only has to load; the benchmark feeds
random token ids. Weights are seeded normals scaled like a trained model's (std 1/sqrt(fan-in)).
"""

import json
import sys

import gguf
import numpy as np

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 1024, 28, 16, 8, 128, 3072, 151936


def main(out, tok_dir):
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(out, "qwen3")
    w.add_name("random Qwen3-0.6B architecture")
    w.add_context_length(40960)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)

    tok = json.load(open(f"{tok_dir}/tokenizer.json"))
    vocab = {t: i for t, i in tok["model"]["vocab"].items()}
    for a in tok["added_tokens"]:
        vocab[a["content"]] = a["id"]
    tokens = [f"[PAD{i}]" for i in range(VOCAB)]
    types = [gguf.TokenType.UNUSED] * VOCAB
    for t, i in vocab.items():
        tokens[i] = t
        types[i] = gguf.TokenType.NORMAL
    for a in tok["added_tokens"]:
        types[a["id"]] = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(False)

    def matrix(name, rows, cols):
        data = (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float32)
        q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q4_1)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_1)

    def norm(name, n):
        w.add_tensor(name, (1.0 + 0.05 * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", VOCAB, HIDDEN)
    norm("output_norm.weight", HIDDEN)
    for i in range(LAYERS):
        p = f"blk.{i}"
        norm(f"{p}.attn_norm.weight", HIDDEN)
        norm(f"{p}.ffn_norm.weight", HIDDEN)
        norm(f"{p}.attn_q_norm.weight", HEAD_DIM)
        norm(f"{p}.attn_k_norm.weight", HEAD_DIM)
        matrix(f"{p}.attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        matrix(f"{p}.attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        matrix(f"{p}.attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        matrix(f"{p}.attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        matrix(f"{p}.ffn_gate.weight", FFN, HIDDEN)
        matrix(f"{p}.ffn_up.weight", FFN, HIDDEN)
        matrix(f"{p}.ffn_down.weight", HIDDEN, FFN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
