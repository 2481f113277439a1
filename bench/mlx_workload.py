"""mlx-lm's side of bench/compare-serve-workload: the same workload file through mlx-lm's
BatchGenerator (continuous batching), each request submitted once it has arrived and a slot is
free, every generated token's time recorded; prints the line nuvec's `bench --workload` prints."""

import json
import math
import sys
import time

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.utils import load_model
from pathlib import Path


def quantile(values, q):
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(max(math.ceil(len(values) * q), 1), len(values)) - 1]


def main():
    model_dir, workload = sys.argv[1], sys.argv[2]
    model, _ = load_model(Path(model_dir))
    spec = json.load(open(workload))
    concurrency = spec["concurrency"]
    planned = sorted(spec["requests"], key=lambda r: r["arrival"])
    gen = BatchGenerator(model, completion_batch_size=max(32, concurrency), prefill_batch_size=8)
    submitted, tokens, index = {}, {}, {}
    nxt, in_flight = 0, 0
    start = time.perf_counter()
    while nxt < len(planned) or in_flight:
        now = time.perf_counter() - start
        while nxt < len(planned) and planned[nxt]["arrival"] <= now and in_flight < concurrency:
            r = planned[nxt]
            (uid,) = gen.insert([r["prompt"]], [r["max_tokens"]])
            index[uid] = nxt
            submitted[nxt] = now
            tokens[nxt] = []
            nxt += 1
            in_flight += 1
        if not in_flight:
            time.sleep(max(planned[nxt]["arrival"] - now, 0.0))
            continue
        _, responses = gen.next()
        t = time.perf_counter() - start
        for r in responses:
            tokens[index[r.uid]].append(t)
            if r.finish_reason is not None:
                in_flight -= 1
    end = time.perf_counter() - start
    gen.close()
    generated = sum(len(v) for v in tokens.values())
    first = min(submitted.values())
    ttft = [v[0] - submitted[i] for i, v in tokens.items() if v]
    itl = [b - a for v in tokens.values() for a, b in zip(v, v[1:])]
    prompt = sum(len(r["prompt"]) for r in planned)
    print(f"Workload: requests={len(planned)} concurrency={concurrency} generated={generated} "
          f"time={end - first:.3f}s prompt_tokens={prompt} cached_tokens=0 preemptions=0")
    print(f"Workload results: throughput={generated / max(end - first, 1e-9):.3f} "
          f"ttft_p50={1e3 * quantile(ttft, 0.5):.1f} ttft_p99={1e3 * quantile(ttft, 0.99):.1f} "
          f"itl_p50={1e3 * quantile(itl, 0.5):.1f} itl_p99={1e3 * quantile(itl, 0.99):.1f}")


if __name__ == "__main__":
    mx.set_default_device(mx.cpu if len(sys.argv) < 4 or sys.argv[3] == "cpu" else mx.gpu)
    main()
