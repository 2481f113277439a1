"""mlx-lm's own bf16-vs-f32 logit difference on the long prompt of the GPU's bf16 prefill test.

    precision_noise_long.py FIXTURES --tokenizers DIR --gguf FILE

crates/nuvec-lm/tests/gpu_parity_bf16.rs prefills a 300-token prompt (fixed pseudo-random ids,
the xorshift below) on the GPU with bf16 tensor-core products and compares every logit of the
prompt and of 31 teacher-forced steps with the CPU's f32 run. Its bound is how far mlx-lm's own
bf16 computation of the same checkpoint is from its f32 computation on those same positions
(the record_precision_noise.py numbers cover a 70-token run, which a 331-position run exceeds).
Writes `precision_noise_long/<case's last part>.json`: max_abs_diff, mean_abs_diff, positions, the f32
greedy tokens used for the steps.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm import load

PROMPT = 300
STEPS = 32
# Case directories below FIXTURES; each record is named by the directory's last part.
CASES = ["mistral-bf16", "moe_bf16/qwen3_moe-bf16q4"]


def prompt_ids(vocab, n):
    # The test's xorshift64 (13, 7, 17) from the same seed.
    mask = (1 << 64) - 1
    state = 0x2545F4914F6CDD1D
    ids = []
    for _ in range(n):
        state ^= (state << 13) & mask
        state ^= state >> 7
        state ^= (state << 17) & mask
        ids.append(state % vocab)
    return ids


def upcast(x):
    return x.astype(mx.float32) if x.dtype in (mx.bfloat16, mx.float16) else x


def main(root):
    out_dir = Path(root) / "precision_noise_long"
    out_dir.mkdir(exist_ok=True)
    for case in CASES:
        model, _ = load(str(Path(root) / case))
        half_model = model
        vocab = model.args.vocab_size
        prompt = prompt_ids(vocab, PROMPT)
        # f32 greedy continuation (what the test's CPU run produces), from a separate f32 copy.
        full_model, _ = load(str(Path(root) / case))
        full_model.update(tree_map(upcast, full_model.parameters()))
        tokens = list(prompt)
        for _ in range(STEPS):
            tokens.append(int(mx.argmax(full_model(mx.array([tokens]))[0, -1])))
        ids = mx.array([tokens[: PROMPT + STEPS - 1]])
        full = full_model(ids)[0]
        half = half_model(ids)[0].astype(mx.float32)
        diff = mx.abs(half - full)
        out = {
            "compute_dtype": str(half_model(mx.array([prompt[:2]])).dtype),
            "max_abs_diff": float(diff.max()),
            "mean_abs_diff": float(diff.mean()),
            "positions": int(ids.shape[1]),
            "f32_greedy_tokens": tokens[PROMPT:],
        }
        (out_dir / f"{Path(case).name}.json").write_text(json.dumps(out, indent=1))
        print(case, {k: v for k, v in out.items() if "diff" in k})


if __name__ == "__main__":
    main(sys.argv[1])
