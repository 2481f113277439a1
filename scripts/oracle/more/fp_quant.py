#!/usr/bin/env python3
"""MLX's floating-point quantization modes (mxfp4, mxfp8, nvfp4), recorded for nuvec's tests.

    fp_quant.py FIXTURES --tokenizers DIR --gguf FILE

Writes only below FIXTURES/fp_quant/:

- matrices.safetensors: per mode, random matrices quantized by mx.quantize (from f32 and from
  bf16 values, plus a matrix of rounding ties and edge values), mx.dequantize's f32 output,
  mx.quantized_matmul's output for a few activation rows, and raw random codes with every scale
  byte dequantized; for nvfp4 also a matrix quantized and dequantized with a global scale.
- <family>-<mode>/: checkpoints written by mlx_lm.convert from the llama-f32 and qwen3-f32 cases
  with q_mode=<mode>, and <family>-fpmixed: per-layer modes mixed by a quant_predicate; and
  qwen3_moe-nvfp4-global: the qwen3_moe-f32 case quantized by mlx_lm.utils.quantize_model in nvfp4
  with global_scale=True (one f32 scale per expert on the stacked expert projections, the only
  place mlx-lm writes one; its router gate is affine 8-bit by the model's own quant_predicate).
  mlx 0.32.4 runs gather_qmm with a global scale only on the GPU, so that case's oracle is mlx-lm
  on the same checkpoint with the expert projections replaced by mx.dequantize's f32 output (the
  other layers stay nvfp4), as make_awq_gptq_fixtures.py does for formats mlx-lm cannot run.
  Each holds oracle.json / oracle.safetensors recorded exactly as make_fixtures.py records its
  cases.

The cases live in a subdirectory so tests that walk every top-level case do not pick them up.
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

import mlx.core as mx
from mlx_lm import load
from mlx_lm.convert import convert
from mlx_lm.utils import quantize_model, save

import make_fixtures as fx

MODES = ("mxfp4", "mxfp8", "nvfp4")
FAMILIES = ("llama", "qwen3")


def mixed_predicate(path, module):
    """Every mode in one checkpoint: mxfp4 by default, one projection in mxfp8, the embedding and
    lm_head in nvfp4, one affine layer and one left dense."""
    if path == "model.layers.0.mlp.down_proj":
        return {"group_size": 32, "bits": 8, "mode": "mxfp8"}
    if path in ("lm_head", "model.embed_tokens"):
        return {"group_size": 16, "bits": 4, "mode": "nvfp4"}
    if path == "model.layers.1.self_attn.v_proj":
        return {"group_size": 32, "bits": 8, "mode": "affine"}
    if path == "model.layers.1.self_attn.k_proj":
        return False
    return True


def edge_matrix(cols):
    """Rows that put values exactly on (and one ulp around) every fp4 and e4m3 rounding boundary,
    with a group maximum that fixes the scale, plus zero, negative and tiny groups."""
    rng = np.random.default_rng(7)
    rows = []
    for top in (6.0, 448.0, 3.0, 0.1):
        fp4_ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32) * (top / 6.0)
        vals = []
        for t in fp4_ties:
            t = np.float32(t)
            vals += [np.nextafter(t, np.float32(0)), t, np.nextafter(t, np.float32(1e9))]
        vals = np.array(vals, np.float32)
        for sign in (1, -1):
            r = np.zeros(cols, np.float32)
            for g in range(0, cols, 16):
                r[g] = top
                chunk = vals[(g // 16 * 5) % len(vals):][:15] * sign
                r[g + 1:g + 1 + len(chunk)] = chunk
            rows.append(r)
    rows.append(np.zeros(cols, np.float32))
    rows.append(-np.abs(rng.standard_normal(cols)).astype(np.float32) * 1e-3)
    tiny = rng.standard_normal(cols).astype(np.float32) * 1e-6
    tiny[::16] = 0.5
    rows.append(tiny)
    # e4m3 midpoints for mxfp8 (group max 448 keeps the scale at 1).
    pos = np.array(mx.from_fp8(mx.arange(127).astype(mx.uint8), dtype=mx.float32)).astype(np.float64)
    mids = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)
    for start in range(0, len(mids), 31 * (cols // 32)):
        r = np.zeros(cols, np.float32)
        for g in range(0, cols, 32):
            r[g] = 448.0
            chunk = mids[start + g // 32 * 31:][:31]
            r[g + 1:g + 1 + len(chunk)] = chunk
        rows.append(r)
        rows.append(-r)
    return np.stack(rows)


def record_matrices(out):
    rng = np.random.default_rng(20261130)
    rows, cols = 48, 256
    tensors, index = {}, {}
    scale_of_row = np.exp(rng.uniform(np.log(1e-3), np.log(30.0), size=(rows, 1)))
    w = (rng.standard_normal((rows, cols)) * scale_of_row).astype(np.float32)
    w_bf16 = mx.array(w).astype(mx.bfloat16)
    x = mx.array(rng.standard_normal((5, cols)).astype(np.float32))
    edge = mx.array(edge_matrix(cols))
    tensors["w"] = mx.array(w)
    tensors["w_bf16"] = w_bf16
    tensors["x"] = x
    tensors["edge"] = edge
    for mode in MODES:
        q, s = mx.quantize(mx.array(w), mode=mode)
        tensors[f"{mode}.weight"], tensors[f"{mode}.scales"] = q, s
        tensors[f"{mode}.dequantized"] = mx.dequantize(q, s, mode=mode, dtype=mx.float32)
        tensors[f"{mode}.matmul"] = mx.quantized_matmul(x, q, s, transpose=True, mode=mode)
        qb, sb = mx.quantize(w_bf16, mode=mode)
        tensors[f"{mode}.bf16.weight"], tensors[f"{mode}.bf16.scales"] = qb, sb
        qe, se = mx.quantize(edge, mode=mode)
        tensors[f"{mode}.edge.weight"], tensors[f"{mode}.edge.scales"] = qe, se
        # Every scale byte, over random codes (NaN codes and scales included).
        group = 16 if mode == "nvfp4" else 32
        words = group * (8 if mode == "mxfp8" else 4) // 32
        raw_q = mx.array(rng.integers(0, 2**32, size=(256, 2 * words), dtype=np.uint32))
        raw_s = mx.array(np.stack([np.arange(256), np.arange(256)[::-1]], 1).astype(np.uint8))
        tensors[f"{mode}.raw.weight"], tensors[f"{mode}.raw.scales"] = raw_q, raw_s
        tensors[f"{mode}.raw.dequantized"] = mx.dequantize(raw_q, raw_s, mode=mode, dtype=mx.float32)
        index[mode] = {"group_size": group, "bits": 8 if mode == "mxfp8" else 4}
    gs = mx.array(np.float32(np.abs(w).max()))
    qg, sg = mx.quantize(mx.array(w), mode="nvfp4", global_scale=gs)
    tensors["nvfp4.global.weight"], tensors["nvfp4.global.scales"] = qg, sg
    tensors["nvfp4.global.global_scale"] = gs.reshape(1)
    tensors["nvfp4.global.dequantized"] = mx.dequantize(qg, sg, mode="nvfp4", global_scale=gs, dtype=mx.float32)
    mx.save_safetensors(str(out / "matrices.safetensors"), tensors)
    (out / "matrices.json").write_text(json.dumps({"modes": index, "rows": rows, "cols": cols}, indent=1))


def make_case(out, fixtures, family, variant):
    case = f"{family}-{variant}"
    case_dir = out / case
    shutil.rmtree(case_dir, ignore_errors=True)
    src = fixtures / f"{family}-f32"
    if variant == "fpmixed":
        kwargs = dict(q_mode="mxfp4", quant_predicate=mixed_predicate)
    else:
        kwargs = dict(q_mode=variant)
    convert(str(src), str(case_dir), quantize=True, dtype="float32", **kwargs)
    (case_dir / "README.md").unlink(missing_ok=True)
    source = json.loads((src / "oracle.json").read_text())
    return fx.record_plain_prompt(case_dir, case, {
        "source_case": f"{family}-f32",
        "weights_seed": source.get("weights_seed"),
        "convert_kwargs": {"quantize": True, "dtype": "float32",
                           **{k: v for k, v in kwargs.items() if k != "quant_predicate"}},
    })


def make_moe_global_case(out, fixtures):
    case = "qwen3_moe-nvfp4-global"
    case_dir = out / case
    shutil.rmtree(case_dir, ignore_errors=True)
    src = fixtures / "qwen3_moe-f32"
    model, tokenizer, config = load(str(src), return_config=True, lazy=True)
    model, config = quantize_model(model, config, None, None, mode="nvfp4", global_scale=True)
    save(case_dir, str(src), model, tokenizer, config)
    (case_dir / "README.md").unlink(missing_ok=True)
    # The oracle's checkpoint: the global-scale expert projections dequantized to f32.
    dense_dir = out / ".qwen3_moe-nvfp4-global-dense"
    shutil.rmtree(dense_dir, ignore_errors=True)
    shutil.copytree(case_dir, dense_dir)
    weights = mx.load(str(case_dir / "model.safetensors"))
    dense_config = json.loads((case_dir / "config.json").read_text())
    for name in [n for n in weights if n.endswith(".global_scale")]:
        base = name[: -len(".global_scale")]
        q, s, gs = weights.pop(f"{base}.weight"), weights.pop(f"{base}.scales"), weights.pop(name)
        weights[f"{base}.weight"] = mx.stack([
            mx.dequantize(q[e], s[e], mode="nvfp4", global_scale=gs[e], dtype=mx.float32)
            for e in range(q.shape[0])
        ])
        for key in ("quantization", "quantization_config"):
            dense_config[key][base] = False
    for f in dense_dir.glob("model*.safetensors*"):
        f.unlink()
    mx.save_safetensors(str(dense_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (dense_dir / "config.json").write_text(json.dumps(dense_config, indent=4, sort_keys=True))
    source = json.loads((src / "oracle.json").read_text())
    record = fx.record_plain_prompt(dense_dir, case, {
        "source_case": "qwen3_moe-f32",
        "weights_seed": source.get("weights_seed"),
        "quantize_model_kwargs": {"mode": "nvfp4", "global_scale": True},
        "oracle": "mlx-lm on this checkpoint with the global-scale expert projections dequantized "
                  "to f32 by mx.dequantize (gather_qmm takes a global scale only on the GPU)",
    })
    record["quantization"] = config.get("quantization")
    (case_dir / "oracle.json").write_text(json.dumps(record, indent=1, ensure_ascii=False))
    shutil.copy(dense_dir / "oracle.safetensors", case_dir / "oracle.safetensors")
    shutil.rmtree(dense_dir)
    return record


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("fixtures", type=Path)
    parser.add_argument("--tokenizers", type=Path)
    parser.add_argument("--gguf", type=Path)
    args = parser.parse_args()
    out = args.fixtures / "fp_quant"
    out.mkdir(parents=True, exist_ok=True)
    record_matrices(out)
    for family in FAMILIES:
        for variant in MODES + ("fpmixed",):
            record = make_case(out, args.fixtures, family, variant)
            print(record["case"], "min margin", record["min_margin"])
    record = make_moe_global_case(out, args.fixtures)
    print(record["case"], "min margin", record["min_margin"])


if __name__ == "__main__":
    main()
