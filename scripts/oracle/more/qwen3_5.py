"""Qwen3.5 hybrid cases (Gated DeltaNet + gated full attention), recorded by mlx-lm's own classes.

    qwen3_5.py FIXTURES --tokenizers DIR --gguf FILE

Writes FIXTURES/qwen3_5/<case>/ (a subfolder, so the generic parity test, which walks the top
level, does not meet a model type that other branches do not load):

- qwen3_5-f32      dense, flat config (mlx-lm reads a config without text_config as the text config)
- qwen3_5-q4g64    the same weights, mlx_lm.convert -q (affine 4-bit, groups of 64)
- qwen3_5_moe-f32  4 experts, top-2, a shared expert with its sigmoid gate
- qwen3_5-vl       the multimodal wrapper: model_type qwen3_5 with text_config and vision_config,
                   plus a vision tensor and a multi-token-prediction tensor that sanitize drops
- qwen3_5-hf       qwen3_5-f32 as a Hugging Face original stores it: `model.language_model.*`
                   names, conv1d weights [C, 1, K], and the (1 + w) norms stored as w
- qwen3_5_moe-hf   qwen3_5_moe-f32 likewise, with each layer's experts fused as Hugging Face
                   stores them (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj`)

Layers alternate linear (Gated DeltaNet) and full attention (full_attention_interval 2, 4 layers).
The prompt is longer than the conv kernel and is prefilled in chunks of PREFILL_STEP, so both the
chunked prefill and the one-token decode of the recurrence are exercised.

oracle.json has the usual fields (make_fixtures.write_oracle) plus `prefill_step_size` and:
- `changed_prompt`: {prompt, prompt_ids, greedy_tokens}: a prompt sharing a prefix with `prompt`
  and then differing (a session must start afresh: a recurrent state cannot be trimmed);
- `continued_prompt`: {prompt_ids, greedy_tokens, reused_generated}: prompt_ids + the first
  `reused_generated` greedy tokens + more text (a session continues without recomputing);
- qwen3_5-f32 only, `quantized_kv`: {kv_bits, kv_group_size, quantized_kv_start, greedy_tokens,
  margins}: generate_step with a quantized KV cache (the attention layers' caches are quantized,
  the recurrent ones are not). head_dim is 64 so that MLX can quantize keys in groups of 64.
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import make_fixtures as fx

mx, np = fx.mx, fx.np

PROMPT = ("The capital of France is Paris. The capital of Germany is Berlin. "
          "The capital of Italy is")
CHANGED = ("The capital of France is Paris. The capital of Germany is Berlin. "
           "The capital of Spain is")
MORE = " Then the capital of Japan is"
PREFILL_STEP = 5
SHORT_STEPS = 16
REUSED_GENERATED = 8

TEXT = dict(
    hidden_size=64,
    num_hidden_layers=4,
    full_attention_interval=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=128,
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    vocab_size=151936,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True,
                     "rope_theta": 10000000, "partial_rotary_factor": 0.25},
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
           shared_expert_intermediate_size=64, norm_topk_prob=True)


def random_weights(model, seed):
    """make_fixtures.random_weights, with the Gated DeltaNet's own parameters in their ranges:
    A_log = log(uniform(1, 16)) as mlx-lm initializes it, dt_bias near 1, and a conv kernel of
    moderate size (the generic rule would give it std 2.5 for its last axis of 1)."""
    out = fx.random_weights(model, seed)
    rng = np.random.default_rng(seed + 1)
    for name, w in out.items():
        if name.endswith("A_log"):
            out[name] = np.log(rng.uniform(1, 16, w.shape)).astype(np.float32)
        elif name.endswith("dt_bias"):
            out[name] = (1.0 + 0.3 * rng.standard_normal(w.shape)).astype(np.float32)
        elif name.endswith("conv1d.weight"):
            out[name] = (0.6 * rng.standard_normal(w.shape)).astype(np.float32)
    return out


def greedy_run(model, prompt_ids, steps, **kwargs):
    """make_fixtures.greedy_run with a small prefill step."""
    captured = []

    def capture(_tokens, logits):
        captured.append(logits)
        return logits

    tokens = []
    for tok, _ in fx.generate_step(mx.array(prompt_ids), model, max_tokens=steps,
                                   logits_processors=[capture], prefill_step_size=PREFILL_STEP, **kwargs):
        tokens.append(int(tok))
    logits = mx.concatenate(captured[: len(tokens)], axis=0).astype(mx.float32)
    return tokens, np.array(logits)


def pick_seed(model, name, prompt_ids):
    base = int(fx.hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    best = None
    for seed in range(base, base + fx.SEED_TRIALS):
        weights = random_weights(model, seed)
        model.load_weights([(k, mx.array(v)) for k, v in weights.items()])
        _, logits = greedy_run(model, prompt_ids, fx.N_STEPS)
        top2 = np.sort(logits, axis=1)[:, -2:]
        score = float((top2[:, 1] - top2[:, 0]).min())
        if best is None or score > best[0]:
            best = (score, seed, weights)
    return best[1], best[2]


def build_source(work, name, config, tokenizers):
    """An f32 source checkpoint (mlx-lm's parameter names) that mlx_lm.convert reads."""
    src = work / f"src-{name}"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    model_cls, args_cls = fx._get_classes(config)
    model = model_cls(args_cls.from_dict(json.loads(json.dumps(config))))
    prompt_ids = fx.load_tokenizer_wrapper(tokenizers / "qwen3").encode(PROMPT)
    seed, weights = pick_seed(model, name, prompt_ids)
    (src / "seed.txt").write_text(str(seed))
    mx.save_safetensors(str(src / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()},
                        metadata={"format": "mlx"})
    (src / "config.json").write_text(json.dumps(config, indent=2))
    fx.copy_tokenizer(tokenizers / "qwen3", src)
    return src


def record(case_dir, case, extra):
    model, tokenizer, config = fx.load(str(case_dir), return_config=True)
    enc = lambda text: tokenizer.encode(text, add_special_tokens=True)  # noqa: E731
    prompt_ids = enc(PROMPT)
    tokens, logits = greedy_run(model, prompt_ids, fx.N_STEPS)
    changed_ids = enc(CHANGED)
    changed_tokens, _ = greedy_run(model, changed_ids, SHORT_STEPS)
    continued_ids = prompt_ids + tokens[:REUSED_GENERATED] + tokenizer.encode(MORE, add_special_tokens=False)
    continued_tokens, _ = greedy_run(model, continued_ids, SHORT_STEPS)
    rec = {
        "case": case,
        "model_type": config["model_type"],
        "dtype": fx.checkpoint_dtype(case_dir),
        "quantization": config.get("quantization"),
        "prompt": PROMPT,
        "prompt_mode": "raw: tokenizer.encode(prompt, add_special_tokens=True), no chat template",
        "prompt_ids": prompt_ids,
        "greedy_tokens": tokens,
        "eos_token_ids": sorted(tokenizer.eos_token_ids),
        "stops_at_eos": False,
        "prefill_step_size": PREFILL_STEP,
        "changed_prompt": {"prompt": CHANGED, "prompt_ids": changed_ids, "greedy_tokens": changed_tokens},
        "continued_prompt": {"prompt_ids": continued_ids, "greedy_tokens": continued_tokens,
                             "reused_generated": REUSED_GENERATED},
    }
    if case == "qwen3_5-f32":
        kv = dict(kv_bits=4, kv_group_size=64, quantized_kv_start=0)
        kv_tokens, kv_logits = greedy_run(model, prompt_ids, SHORT_STEPS, **kv)
        top2 = np.sort(kv_logits, axis=1)[:, -2:]
        rec["quantized_kv"] = dict(kv, greedy_tokens=kv_tokens, margins=[float(m) for m in top2[:, 1] - top2[:, 0]])
    rec.update(extra)
    fx.write_oracle(case_dir, rec, logits, tokens)
    return rec


def make_case(out, work, tokenizers, case, config, quant=None):
    case_dir = out / case
    shutil.rmtree(case_dir, ignore_errors=True)
    src = build_source(work, case, config, tokenizers)
    kwargs = dict(quantize=quant is not None, dtype="float32", **(quant or {}))
    fx.convert(str(src), str(case_dir), **kwargs)
    (case_dir / "README.md").unlink(missing_ok=True)
    return case_dir, src, kwargs


def add_tensors(case_dir, extra):
    """Adds tensors to the checkpoint's single file (and its index), as a published multimodal
    checkpoint carries them; mlx-lm's sanitize drops them."""
    path = case_dir / "model.safetensors"
    weights = mx.load(str(path))
    weights.update(extra)
    mx.save_safetensors(str(path), weights, metadata={"format": "mlx"})
    index = case_dir / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"].update({k: "model.safetensors" for k in extra})
    index.write_text(json.dumps(data, indent=4))


SHIFTED_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                 ".q_norm.weight", ".k_norm.weight")


def to_hf(weights, shifted=SHIFTED_NORMS):
    """mlx-lm's tensors (`weights`, consumed) as a Hugging Face original stores them: experts fused
    (`experts.gate_up_proj`, `experts.down_proj`), convolutions [C, 1, K], the norms ending in
    `shifted` stored as w for 1 + w, and `model.language_model.*` names."""
    for name in [n for n in weights if ".mlp.switch_mlp.gate_proj." in n]:
        prefix = name.split(".switch_mlp.")[0]
        gate, up = weights.pop(name), weights.pop(f"{prefix}.switch_mlp.up_proj.weight")
        weights[f"{prefix}.experts.gate_up_proj"] = mx.concatenate([gate, up], axis=1)
        weights[f"{prefix}.experts.down_proj"] = weights.pop(f"{prefix}.switch_mlp.down_proj.weight")
    hf = {}
    for name, w in weights.items():
        if name.endswith("conv1d.weight"):
            w = w.moveaxis(2, 1)  # mlx [C, K, 1] -> torch [C, 1, K]
        elif name.endswith(shifted):
            w = w - 1.0
        if name.startswith("language_model.model."):
            name = "model.language_model." + name[len("language_model.model."):]
        elif name.startswith("language_model."):
            name = name[len("language_model."):]
        hf[name] = w
    return hf


def make_hf(out, src_case, case):
    """`src_case` renamed and reshaped as a Hugging Face original; mlx-lm's sanitize must undo it."""
    src, case_dir = out / src_case, out / case
    shutil.rmtree(case_dir, ignore_errors=True)
    shutil.copytree(src, case_dir)
    for f in ("oracle.json", "oracle.safetensors", "model.safetensors.index.json"):
        (case_dir / f).unlink(missing_ok=True)
    hf = to_hf(mx.load(str(src / "model.safetensors")))
    mx.save_safetensors(str(case_dir / "model.safetensors"), hf, metadata={"format": "pt"})
    return record(case_dir, case, {"source": f"{src_case} in Hugging Face layout"})


def text_configs():
    """The dense and the mixture-of-experts flat configs (model_type qwen3_5 / qwen3_5_moe)."""
    dense = dict(TEXT, model_type="qwen3_5", eos_token_id=151645, architectures=["Qwen3_5ForCausalLM"])
    moe = dict(dense, **MOE, model_type="qwen3_5_moe", architectures=["Qwen3_5MoeForCausalLM"])
    return dense, moe


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixtures", type=Path)
    ap.add_argument("--tokenizers", type=Path, required=True)
    ap.add_argument("--gguf", type=Path)
    args = ap.parse_args()
    mx.random.seed(0)
    out = args.fixtures / "qwen3_5"
    out.mkdir(parents=True, exist_ok=True)
    dense, moe = text_configs()
    wrapper = {
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "eos_token_id": 151645,
        "tie_word_embeddings": False,
        "image_token_id": 151655,
        "text_config": dict(TEXT, model_type="qwen3_5_text", eos_token_id=151645),
        "vision_config": {"model_type": "qwen3_5", "depth": 1, "hidden_size": 32, "patch_size": 16},
    }
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        for case, config, quant in [("qwen3_5-f32", dense, None),
                                    ("qwen3_5-q4g64", dense, dict(q_bits=4, q_group_size=64)),
                                    ("qwen3_5_moe-f32", moe, None)]:
            case_dir, src, kwargs = make_case(out, work, args.tokenizers, case, config, quant)
            rec = record(case_dir, case, {"weights_seed": int((src / "seed.txt").read_text()),
                                          "convert_kwargs": kwargs})
            print(case, "min margin", rec["min_margin"])
        case_dir, src, kwargs = make_case(out, work, args.tokenizers, "qwen3_5-vl", wrapper)
        add_tensors(case_dir, {
            "model.visual.patch_embed.proj.weight": mx.ones((32, 3, 2, 16, 16)),
            "vision_tower.blocks.0.attn.qkv.weight": mx.ones((96, 32)),
            "language_model.mtp.fc.weight": mx.ones((64, 128)),
            "mtp.layers.0.input_layernorm.weight": mx.ones((64,)),
        })
        rec = record(case_dir, "qwen3_5-vl", {"weights_seed": int((src / "seed.txt").read_text()),
                                             "convert_kwargs": kwargs,
                                             "unread_tensors": ["model.visual.*", "vision_tower.*", "*mtp.*"]})
        print("qwen3_5-vl min margin", rec["min_margin"])
    for src_case, case in [("qwen3_5-f32", "qwen3_5-hf"), ("qwen3_5_moe-f32", "qwen3_5_moe-hf")]:
        rec = make_hf(out, src_case, case)
        print(case, "min margin", rec["min_margin"])


if __name__ == "__main__":
    main()
