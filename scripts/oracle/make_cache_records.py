"""Records mlx-lm's generation with its other KV caches, and a two-turn chat.

    make_cache_records.py FIXTURES_DIR --tokenizers DIR

Writes FIXTURES_DIR/caches/<name>.json, each {"case", "settings", "prompt_ids", "greedy_tokens",
"step_top_ids", "step_top_logits", "margins"} (top-16 per step), for:
- rotating caches (mlx-lm's `max_kv_size`: RotatingKVCache(max_size, keep=4)) over a prompt longer
  than the window, prefilled at once and in chunks, on qwen3-f32;
- quantized KV caches (kv_bits, kv_group_size, quantized_kv_start) on a Qwen3 case with head_dim 64
  (`qwen3-hd64-f32`, written here as a parity case of its own: KV groups need head_dim >= 32);
- a two-turn chat on qwen3-f32, turn 2 generated from the whole re-rendered conversation.
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import make_fixtures as fx
import mlx.core as mx
import numpy as np
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

LONG_PROMPT = (
    "Once upon a time, in a quiet village by the sea, there lived an old fisherman who told "
    "stories about the stars, the tides and the strange lights over the water every night."
)
STEPS = 48
HD64 = dict(fx.TINY, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            intermediate_size=256)


def run(model, prompt_ids, **kwargs):
    captured = []

    def capture(_tokens, logits):
        captured.append(logits)
        return logits

    tokens = []
    for tok, _ in generate_step(mx.array(prompt_ids), model, max_tokens=STEPS,
                                logits_processors=[capture], **kwargs):
        tokens.append(int(tok))
    logits = np.array(mx.concatenate(captured[: len(tokens)], axis=0).astype(mx.float32))
    ids, vals = fx.top_k_table(logits)
    return {
        "prompt_ids": list(prompt_ids),
        "greedy_tokens": tokens,
        "step_top_ids": ids.tolist(),
        "step_top_logits": vals.tolist(),
        "margins": [float(v[0] - v[1]) for v in vals],
    }


def write(out, name, case, settings, record):
    (out / "caches").mkdir(exist_ok=True)
    record = {"case": case, "settings": settings, **record}
    (out / "caches" / f"{name}.json").write_text(json.dumps(record))
    print(name, "min margin", min(record["margins"]))


def make_hd64_case(out, tokenizers):
    original = fx.hf_config

    def hf_config(family, width):
        if width != "hd64":
            return original(family, width)
        config = dict(HD64)
        fields, _, arch = fx.FAMILIES[family]
        config.update(fields)
        config["architectures"] = [arch]
        config["torch_dtype"] = "float32"
        return config

    fx.hf_config = hf_config
    fx.VARIANTS["hd64-f32"] = ("hd64", "float32", None)
    with tempfile.TemporaryDirectory() as work:
        record = fx.make_case(out, Path(work), tokenizers, "qwen3", "hd64-f32")
    print(record["case"], "min margin", record["min_margin"])
    return out / "qwen3-hd64-f32"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizers", type=Path, required=True)
    args = parser.parse_args()
    out = args.out
    shutil.rmtree(out / "caches", ignore_errors=True)

    model, tokenizer = load(str(out / "qwen3-f32"))
    long_ids = tokenizer.encode(LONG_PROMPT)
    for name, settings in [
        ("rotating16-whole", {"max_kv_size": 16, "prefill_step_size": 2048}),
        ("rotating16-chunked", {"max_kv_size": 16, "prefill_step_size": 8}),
        ("rotating32-whole", {"max_kv_size": 32, "prefill_step_size": 2048}),
    ]:
        write(out, name, "qwen3-f32", settings, run(model, long_ids, **settings))

    hd64 = make_hd64_case(out, args.tokenizers)
    model, tokenizer = load(str(hd64))
    ids = tokenizer.encode(LONG_PROMPT)
    for name, settings in [
        ("kv8-g64-start0", {"kv_bits": 8, "kv_group_size": 64, "quantized_kv_start": 0}),
        ("kv4-g32-start8", {"kv_bits": 4, "kv_group_size": 32, "quantized_kv_start": 8}),
        ("kv4-g64-start0-chunked", {"kv_bits": 4, "kv_group_size": 64, "quantized_kv_start": 0, "prefill_step_size": 8}),
    ]:
        write(out, name, "qwen3-hd64-f32", settings, run(model, ids, **settings))

    # Two turns; turn 2 re-renders the whole conversation, as a chat front end must.
    model, tokenizer = load(str(out / "qwen3-f32"))
    chat = []
    turns = ["Hello, who are you?", "Tell me more about that."]
    record = {"turns": []}
    for user in turns:
        chat.append({"role": "user", "content": user})
        rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer.encode(rendered, add_special_tokens=False)
        cache = make_prompt_cache(model)
        tokens = []
        for tok, _ in generate_step(mx.array(prompt_ids), model, max_tokens=12, prompt_cache=cache):
            tok = int(tok)
            if tok in tokenizer.eos_token_ids:
                break
            tokens.append(tok)
        reply = tokenizer.decode(tokens)
        record["turns"].append({"messages": list(chat), "rendered": rendered, "prompt_ids": prompt_ids,
                                "tokens": tokens, "reply": reply})
        chat.append({"role": "assistant", "content": reply})
    (out / "caches" / "chat.json").write_text(json.dumps(record, ensure_ascii=False))
    print("chat", [t["tokens"] for t in record["turns"]])


if __name__ == "__main__":
    main()
