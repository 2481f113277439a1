#!/usr/bin/env python3
"""A half-precision quantized mixture-of-experts checkpoint, for the GPU's grouped expert products.

    moe_bf16_q4.py FIXTURES --tokenizers DIR --gguf FILE

Writes only below FIXTURES/moe_bf16/: qwen3_moe-bf16q4, the qwen3_moe-f32 case cast to bf16 and
quantized by mlx_lm.utils.quantize_model to 4-bit groups of 64, so that its scales and biases are
bf16 as in mlx-community's MoE checkpoints (the form the GPU's grouped prefill products take;
the router gate is 8-bit by the model's own quant_predicate). precision_noise_long.py records
mlx-lm's own bf16-vs-f32 logit difference on it. The case lives in a subdirectory so tests that
walk every top-level case do not pick it up.
"""

import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm import load
from mlx_lm.utils import quantize_model, save


def to_bf16(x):
    return x.astype(mx.bfloat16) if x.dtype in (mx.float32, mx.float16) else x


def main(root):
    fixtures = Path(root)
    case_dir = fixtures / "moe_bf16" / "qwen3_moe-bf16q4"
    shutil.rmtree(case_dir, ignore_errors=True)
    src = fixtures / "qwen3_moe-f32"
    model, tokenizer, config = load(str(src), return_config=True)
    model.update(tree_map(to_bf16, model.parameters()))
    config["torch_dtype"] = "bfloat16"
    model, config = quantize_model(model, config, 64, 4)
    save(case_dir, str(src), model, tokenizer, config)
    (case_dir / "README.md").unlink(missing_ok=True)
    print("wrote", case_dir)


if __name__ == "__main__":
    main(sys.argv[1])
