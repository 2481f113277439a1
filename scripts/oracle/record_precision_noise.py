"""For every case mlx-lm computes in half precision, records what mlx-lm computes for the same
weights in f32, and how far its own half-precision logits are from that.

    record_precision_noise.py FIXTURES_DIR

nuvec keeps activations in f32, so for these cases its logits should equal mlx-lm's f32 logits
on the same (half-precision) weights tightly, and differ from mlx-lm's bf16 run by about as much
as mlx-lm's two precisions differ from each other. Writes into each such case:
- `precision_noise.json`: compute_dtype; max_abs_diff and mean_abs_diff between the two
  precisions over every step of the recorded greedy run (teacher-forced on its tokens);
  f32_greedy_tokens and f32_margins, the greedy run of the f32 computation itself;
- `precision_f32.safetensors`: f32_first_logits [vocab]; f32_step_top_ids / f32_step_top_logits
  [steps, 16], the f32 computation teacher-forced on the recorded (half-precision) greedy tokens.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map
from mlx_lm import load

TOP = 16


def upcast(x):
    return x.astype(mx.float32) if x.dtype in (mx.bfloat16, mx.float16) else x


def top(logits):
    order = mx.argsort(-logits, axis=-1)[..., :TOP]
    return order.astype(mx.int32), mx.take_along_axis(logits, order, axis=-1)


def own_cases(root):
    """Each case folder under `root` with its oracle record, where mlx-lm ran the case's own
    checkpoint: not the AWQ/GPTQ cases, recorded from their dense f32 equivalent, which have no
    half-precision run of their own."""
    for case in sorted(Path(root).iterdir()):
        oracle = case / "oracle.json"
        if not oracle.exists() or not (case / "config.json").exists():
            continue
        record = json.loads(oracle.read_text())
        if "oracle" not in record:
            yield case, record


def main(root):
    for case, record in own_cases(root):
        model, _ = load(str(case))
        prompt, greedy = record["prompt_ids"], record["greedy_tokens"]
        ids = mx.array([prompt + greedy])
        # The logits that chose each greedy token: from the last prompt position on.
        half = model(ids)[0, len(prompt) - 1 : len(prompt) - 1 + len(greedy)]
        if half.dtype == mx.float32:
            continue
        model.update(tree_map(upcast, model.parameters()))
        full = model(ids)[0, len(prompt) - 1 : len(prompt) - 1 + len(greedy)]
        diff = mx.abs(half.astype(mx.float32) - full)
        top_ids, top_logits = top(full)

        tokens, margins = list(prompt), []
        for _ in range(len(greedy)):
            logits = model(mx.array([tokens]))[0, -1]
            best = mx.sort(logits)[-2:]
            margins.append(float(best[1] - best[0]))
            tokens.append(int(mx.argmax(logits)))

        out = {
            "compute_dtype": str(half.dtype),
            "max_abs_diff": float(diff.max()),
            "mean_abs_diff": float(diff.mean()),
            "f32_greedy_tokens": tokens[len(prompt):],
            "f32_margins": margins,
        }
        (case / "precision_noise.json").write_text(json.dumps(out, indent=1))
        mx.save_safetensors(
            str(case / "precision_f32.safetensors"),
            {"f32_first_logits": full[0], "f32_step_top_ids": top_ids, "f32_step_top_logits": top_logits},
        )
        print(case.name, {k: v for k, v in out.items() if "diff" in k})


if __name__ == "__main__":
    main(sys.argv[1])
