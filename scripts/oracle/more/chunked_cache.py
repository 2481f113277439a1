"""mlx-lm's ChunkedKVCache (Llama 4's local-attention layers) driven step by step.

Writes FIXTURES/chunked_cache/chunked.safetensors and chunked.json: a sequence of forward passes (and
one trim) over random queries, keys and values; for each pass the attention output Llama 4
computes with the cache's keys and its chunk mask, and the cache's offset and start position.
"""

import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import ChunkedKVCache

CHUNK = 8
HEADS, KV_HEADS, DIM = 4, 2, 8
# Positions per forward pass; ("trim", n) trims between passes.
STEPS = [5, 1, 1, 4, 1, 13, 1, ("trim", 2), 1, 1, 9, 1, 1]


def chunk_mask(start, offset, length):
    """The mask llama4.LlamaModel builds for its chunked layers."""
    end = offset + length
    linds = mx.arange(start, end)
    rinds = mx.arange(offset, end)[:, None]
    block_pos = mx.abs((linds // CHUNK) - (rinds // CHUNK))
    return (block_pos == 0) & (linds <= rinds)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("fixtures", type=Path)
    parser.add_argument("--tokenizers", type=Path)
    parser.add_argument("--gguf", type=Path)
    out = parser.parse_args().fixtures / "chunked_cache"
    out.mkdir(parents=True, exist_ok=True)

    mx.random.seed(7)
    cache = ChunkedKVCache(CHUNK)
    arrays, steps = {}, []
    scale = DIM**-0.5
    for i, step in enumerate(STEPS):
        if isinstance(step, tuple):
            trimmed = cache.trim(step[1])
            steps.append({"trim": step[1], "trimmed": trimmed, "offset": cache.offset,
                          "start": cache.start_position})
            continue
        q = mx.random.normal((1, HEADS, step, DIM))
        k = mx.random.normal((1, KV_HEADS, step, DIM))
        v = mx.random.normal((1, KV_HEADS, step, DIM))
        cache.maybe_trim_front()
        start, offset = cache.start_position, cache.offset
        keys, values = cache.update_and_fetch(k, v)
        o = mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale,
                                                 mask=chunk_mask(start, offset, step))
        # Positions first, as nuvec's projections give them: [L, heads, dim].
        arrays[f"q{i}"] = q[0].transpose(1, 0, 2)
        arrays[f"k{i}"] = k[0].transpose(1, 0, 2)
        arrays[f"v{i}"] = v[0].transpose(1, 0, 2)
        arrays[f"out{i}"] = o[0].transpose(1, 0, 2).reshape(step, HEADS * DIM)
        steps.append({"length": step, "offset": cache.offset, "start": cache.start_position,
                      "held": int(keys.shape[2])})
    # mlx-lm trims fewer positions than asked, silently, past what it holds; nuvec errors.
    held = cache.offset - cache.start_position
    over = {"asked": held + 3, "trimmed": cache.trim(held + 3)}
    mx.save_safetensors(str(out / "chunked.safetensors"), arrays)
    record = {"chunk_size": CHUNK, "heads": HEADS, "kv_heads": KV_HEADS, "dim": DIM, "scale": scale,
              "steps": steps, "trim_past_held": over}
    (out / "chunked.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
