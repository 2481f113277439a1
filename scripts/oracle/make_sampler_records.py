"""Records mlx-lm's sampler filters and logits processors on fixed logits.

    make_sampler_records.py OUT.json

The Rust tests (crates/nuvec-lm/tests/sampling.rs) apply nuvec's filters to the same inputs and
compare. Deterministic: the inputs come from a seeded numpy generator, and XTC is recorded with
probability 1 so its random gate always opens.
"""

import json
import sys

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    apply_xtc,
    make_logits_processors,
)

VOCAB = 64


def logits_cases():
    rng = np.random.default_rng(1234)
    flat = rng.normal(0.0, 0.5, VOCAB)  # many similar tokens: filters keep many
    peaked = rng.normal(0.0, 3.0, VOCAB)  # a few dominant tokens
    ties = np.round(rng.normal(0.0, 1.0, VOCAB), 1)  # repeated values: tie handling
    return {"flat": flat, "peaked": peaked, "ties": ties}


def as_list(x):
    # -inf is not JSON: write it as null.
    return [None if not np.isfinite(v) else float(v) for v in np.array(x.astype(mx.float32)).reshape(-1)]


def logprobs_of(logits):
    x = mx.array(logits.astype(np.float32))[None]
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def main(out_path):
    records = {"vocab": VOCAB, "filters": [], "processors": [], "distributions": []}
    for name, logits in logits_cases().items():
        lp = logprobs_of(logits)
        base = {"case": name, "logprobs": as_list(lp)}
        for p in (0.3, 0.9):
            records["filters"].append({**base, "filter": "top_p", "top_p": p, "out": as_list(apply_top_p(lp, p))})
        for min_p, keep in ((0.05, 1), (0.2, 3), (0.9, 1)):
            out = apply_min_p(lp, min_p, keep)
            records["filters"].append({**base, "filter": "min_p", "min_p": min_p, "min_tokens_to_keep": keep, "out": as_list(out)})
        for threshold, special in ((0.1, [0, 5]), (0.02, [])):
            out = apply_xtc(lp, 1.0, threshold, special)
            records["filters"].append({**base, "filter": "xtc", "xtc_threshold": threshold, "special": special, "out": as_list(out)})
        for k in (1, 5, 20):
            records["filters"].append({**base, "filter": "top_k", "top_k": k, "out": as_list(apply_top_k(lp, k))})

        history = [3, 7, 7, 11, 3, 3, 42, 9]
        settings = [
            {"repetition_penalty": 1.3, "repetition_context_size": 4},
            {"repetition_penalty": 0.8, "repetition_context_size": 20},
            {"presence_penalty": 0.5, "presence_context_size": 6},
            {"frequency_penalty": 0.4, "frequency_context_size": 20},
            {"logit_bias": {"5": 2.5, "9": -3.0}},
            {"logit_bias": {"3": 1.0}, "repetition_penalty": 1.2, "presence_penalty": 0.3, "frequency_penalty": 0.2},
        ]
        for s in settings:
            kwargs = dict(s)
            if "logit_bias" in kwargs:
                kwargs["logit_bias"] = {int(k): v for k, v in kwargs["logit_bias"].items()}
            x = mx.array(logits.astype(np.float32))[None]
            for proc in make_logits_processors(**kwargs):
                x = proc(mx.array(history), x)
            records["processors"].append({"case": name, "logits": [float(v) for v in logits.astype(np.float32)], "history": history, "settings": s, "out": as_list(x)})

        # The distribution make_sampler draws from: its filters in its order, then
        # categorical(logprobs / temp) = softmax(filtered / temp).
        for temp, top_p, min_p, top_k in ((0.7, 0.9, 0.05, 10), (1.3, 1.0, 0.0, 0), (0.5, 0.0, 0.1, 0)):
            filtered = lp
            if 0 < top_p < 1.0:
                filtered = apply_top_p(filtered, top_p)
            if min_p != 0.0:
                filtered = apply_min_p(filtered, min_p, 1)
            if top_k > 0:
                filtered = apply_top_k(filtered, top_k)
            probs = mx.softmax(filtered * (1.0 / temp), axis=-1)
            records["distributions"].append({
                "case": name, "logprobs": as_list(lp), "temperature": temp, "top_p": top_p,
                "min_p": min_p, "top_k": top_k, "probs": [float(v) for v in np.array(probs).reshape(-1)],
            })
    with open(out_path, "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
