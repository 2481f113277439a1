"""mlx-lm computing a half-precision checkpoint in f32 with a half-precision KV cache: the
like-for-like record of nuvec's default path for those checkpoints.

    kv_half_cache.py FIXTURES --tokenizers DIR --gguf FILE

nuvec computes a bf16 (or f16) checkpoint's activations in f32 and, as mlx-lm does, stores its KV
cache in the checkpoint's dtype. mlx-lm's own runs either compute everything in half precision
(oracle.json) or everything in f32 (precision_noise.json); neither is nuvec's default. Here the
weights are upcast to f32 and every layer's cache rounds the keys and values it stores to the
checkpoint's dtype (and hands them back widened to f32, as nuvec's attention reads them). The
run is greedy and decodes as nuvec's generate does: the prompt in one pass, then a token at a
time. For every case that mlx-lm computes in half precision, writes
`kv_half_cache/<case>.json`: kv_dtype; greedy_tokens and margins (the top-2 gap of each step);
cache_noise_max and cache_noise_mean, how far the same f32 computation with an f32 cache is from
this one, teacher-forced on these tokens (what rounding the cache does, which bounds what a
rounding boundary crossed differently can do); and `kv_half_cache/<case>.safetensors`:
first_logits [vocab], step_top_ids / step_top_logits [steps, 16].
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm import load
from mlx_lm.models.cache import KVCache, make_prompt_cache
from record_precision_noise import own_cases

TOP = 16


def upcast(x):
    return x.astype(mx.float32) if x.dtype in (mx.bfloat16, mx.float16) else x


class RoundingCache(KVCache):
    """A KV cache storing keys and values rounded to `dtype`, returning them as f32."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def update_and_fetch(self, keys, values):
        keys = keys.astype(self.dtype).astype(mx.float32)
        values = values.astype(self.dtype).astype(mx.float32)
        return super().update_and_fetch(keys, values)


def greedy(model, prompt, steps, dtype):
    """Greedy decoding with a rounding cache: every step's logits and the tokens."""
    cache = [RoundingCache(dtype) for _ in make_prompt_cache(model)]
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    rows, tokens = [], []
    for _ in range(steps):
        rows.append(logits)
        tokens.append(int(mx.argmax(logits)))
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1]
    return mx.stack(rows), tokens


def main(root):
    out_dir = Path(root) / "kv_half_cache"
    out_dir.mkdir(exist_ok=True)
    for case, record in own_cases(root):
        model, _ = load(str(case))
        prompt, steps = record["prompt_ids"], len(record["greedy_tokens"])
        dtype = model(mx.array([prompt[:1]])).dtype
        if dtype == mx.float32:
            continue
        model.update(tree_map(upcast, model.parameters()))
        rows, tokens = greedy(model, prompt, steps, dtype)
        top2 = mx.sort(rows, axis=-1)[:, -2:]
        margins = (top2[:, 1] - top2[:, 0]).tolist()
        # The same f32 computation with an f32 cache, teacher-forced on these tokens.
        ids = mx.array([prompt + tokens[:-1]])
        full = model(ids)[0, len(prompt) - 1 :]
        diff = mx.abs(full - rows)
        order = mx.argsort(-rows, axis=-1)[:, :TOP]
        out = {
            "kv_dtype": str(dtype),
            "greedy_tokens": tokens,
            "margins": margins,
            "cache_noise_max": float(diff.max()),
            "cache_noise_mean": float(diff.mean()),
        }
        (out_dir / f"{case.name}.json").write_text(json.dumps(out, indent=1))
        mx.save_safetensors(
            str(out_dir / f"{case.name}.safetensors"),
            {
                "first_logits": rows[0],
                "step_top_ids": order.astype(mx.int32),
                "step_top_logits": mx.take_along_axis(rows, order, axis=-1),
            },
        )
        print(case.name, {k: v for k, v in out.items() if "noise" in k or k == "kv_dtype"})


if __name__ == "__main__":
    main(sys.argv[1])
