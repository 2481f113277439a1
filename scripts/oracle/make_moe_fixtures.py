"""Mixture-of-experts cases, built and recorded exactly as make_fixtures.py builds the dense ones.

    make_moe_fixtures.py OUT --tokenizers DIR

Qwen3-MoE: 4 experts, 2 per token, normalized top-k scores; layer 0 dense (mlp_only_layers),
layer 1 sparse. Variants f32, bf16 and affine 4-bit g64 (the expert width is 64 so that every
expert matrix quantizes).
"""

import argparse
import tempfile
from pathlib import Path

import make_fixtures as fx

fx.FAMILIES["qwen3_moe"] = (
    dict(model_type="qwen3_moe", vocab_size=151936, tie_word_embeddings=False,
         rms_norm_eps=1e-6, rope_theta=1000000.0, eos_token_id=151645,
         num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
         decoder_sparse_step=1, mlp_only_layers=[0], norm_topk_prob=True),
    "qwen3", "Qwen3MoeForCausalLM")

VARIANTS = ("f32", "q4g64", "q8g32")


def pick_seed_f32(model, family, width, prompt):
    """make_fixtures.pick_seed without its bf16 runs, which mlx's CPU MoE cannot do."""
    base = int(fx.hashlib.sha256(f"{family}-{width}".encode()).hexdigest()[:8], 16)
    best = None
    for seed in range(base, base + fx.SEED_TRIALS):
        weights = fx.random_weights(model, seed)
        model.load_weights([(k, fx.mx.array(v)) for k, v in weights.items()])
        _, _, logits = fx.greedy_run(model, prompt, fx.N_STEPS)
        top2 = fx.np.sort(logits, axis=1)[:, -2:]
        score = float((top2[:, 1] - top2[:, 0]).min())
        if best is None or score > best[0]:
            best = (score, seed, weights)
    return best[1], best[2]


fx.pick_seed = pick_seed_f32


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizers", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        for variant in VARIANTS:
            record = fx.make_case(args.out, Path(work), args.tokenizers, "qwen3_moe", variant)
            print(record["case"], "min margin", record["min_margin"])


if __name__ == "__main__":
    main()
