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


def make_hf_per_expert(out):
    """qwen3_moe-f32's weights as a Hugging Face original publishes them: one module per expert
    (`mlp.experts.{e}.{gate,up,down}_proj`), which mlx-lm stacks in its sanitize. Same weights,
    so the same oracle records."""
    import json
    import shutil

    src, case = out / "qwen3_moe-f32", out / "qwen3_moe-hf"
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(src, case)
    weights = fx.mx.load(str(src / "model.safetensors"))
    per_expert = {}
    for name, w in weights.items():
        if ".mlp.switch_mlp." in name:
            prefix, proj = name.split(".mlp.switch_mlp.")
            for e in range(w.shape[0]):
                per_expert[f"{prefix}.mlp.experts.{e}.{proj}"] = w[e]
        else:
            per_expert[name] = w
    (case / "model.safetensors.index.json").unlink(missing_ok=True)
    fx.mx.save_safetensors(str(case / "model.safetensors"), per_expert, metadata={"format": "pt"})
    model, _ = fx.load(str(case))  # mlx-lm must read it
    record = json.loads((case / "oracle.json").read_text())
    record["case"] = "qwen3_moe-hf"
    logits = model(fx.mx.array([record["prompt_ids"]]))[0, -1]
    first = fx.mx.load(str(src / "oracle.safetensors"))["first_logits"]
    assert float(fx.mx.abs(logits - first).max()) == 0.0, "per-expert weights load differently in mlx-lm"
    (case / "oracle.json").write_text(json.dumps(record, indent=1))
    print("qwen3_moe-hf: mlx-lm reads the per-expert layout as the stacked one")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizers", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        for variant in VARIANTS:
            record = fx.make_case(args.out, Path(work), args.tokenizers, "qwen3_moe", variant)
            print(record["case"], "min margin", record["min_margin"])
    make_hf_per_expert(args.out)


if __name__ == "__main__":
    main()
