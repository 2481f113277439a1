"""AutoAWQ and GPTQ checkpoints, and what their weights mean.

    make_awq_gptq_fixtures.py FIXTURES_DIR

From llama-f32's weights, every decoder linear layer is quantized (groups of 64 along the input)
and written in AutoAWQ's layout (4-bit, GEMM packing) and in GPTQ's (4- and 8-bit, v1 format with
its zero-minus-one and a trivial g_idx), beside the f32 norms and embeddings. The oracle for each
is mlx-lm run on the *dense* f32 checkpoint of exactly the dequantized weights `(q - z) * s`: what
the file means, independent of any converter. (mlx-lm 0.32.2 reads GPTQ checkpoints with AWQ's
transposed, interleaved layout, which garbles them, so it cannot be the oracle for GPTQ.)

Writes cases llama-awq4, llama-gptq4, llama-gptq8 (quantized files + oracle.json/.safetensors from
the dense run, recorded like every other case).
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import make_fixtures as fx
import mlx.core as mx
import numpy as np

GROUP = 64
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ packs column j*8+AWQ_ORDER[i] into nibble i


def quantize(w, bits):
    """Asymmetric per-group quantization along the input dim: q, zeros, f16 scales [in/g, out]."""
    out_f, in_f = w.shape
    g = w.reshape(out_f, in_f // GROUP, GROUP)
    levels = 2**bits - 1
    lo, hi = g.min(-1), g.max(-1)
    scales = np.maximum((hi - lo) / levels, 1e-6).astype(np.float16)
    s = scales.astype(np.float32)
    zeros = np.clip(np.round(-lo / s), 0, levels).astype(np.int64)
    q = np.clip(np.round(g / s[..., None]) + zeros[..., None], 0, levels).astype(np.int64)
    dense = ((q - zeros[..., None]) * s[..., None]).reshape(out_f, in_f).astype(np.float32)
    return q.reshape(out_f, in_f), zeros.T, scales.T, dense  # zeros/scales [in/g, out]


def pack_rows(values, bits):
    """Pack along the last axis, LSB first, 32/bits values per int32."""
    per = 32 // bits
    v = values.reshape(*values.shape[:-1], values.shape[-1] // per, per).astype(np.uint32)
    words = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i in range(per):
        words |= v[..., i] << np.uint32(bits * i)
    return words.view(np.int32)


def awq_pack(values):
    """AutoAWQ GEMM packing of [rows, cols] 4-bit values along cols, in its interleaved order."""
    rows, cols = values.shape
    v = values.reshape(rows, cols // 8, 8)
    words = np.zeros((rows, cols // 8), dtype=np.uint32)
    for i, col in enumerate(AWQ_ORDER):
        words |= v[..., col].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def main(out):
    src = out / "llama-f32"
    weights = {k: np.array(v) for k, v in mx.load(str(src / "model.safetensors")).items()}
    config = json.loads((src / "config.json").read_text())
    for name, method, bits in (("llama-awq4", "awq", 4), ("llama-gptq4", "gptq", 4), ("llama-gptq8", "gptq", 8)):
        case = out / name
        shutil.rmtree(case, ignore_errors=True)
        case.mkdir()
        quantized, dense = {}, {}
        for k, w in weights.items():
            if not (k.startswith("model.layers.") and k.endswith("_proj.weight")):
                quantized[k] = dense[k] = w
                continue
            prefix = k[: -len(".weight")]
            q, zeros, scales, deq = quantize(w, bits)
            dense[k] = deq
            if method == "awq":
                quantized[f"{prefix}.qweight"] = awq_pack(q.T)  # [in, out/8]
                quantized[f"{prefix}.qzeros"] = awq_pack(zeros)  # [in/g, out/8]
            else:
                quantized[f"{prefix}.qweight"] = np.ascontiguousarray(pack_rows(q, bits).T)  # [in*bits/32, out]
                # GPTQ v1 stores zero - 1.
                quantized[f"{prefix}.qzeros"] = pack_rows(zeros - 1, bits)  # [in/g, out*bits/32]
                quantized[f"{prefix}.g_idx"] = (np.arange(w.shape[1]) // GROUP).astype(np.int32)
            quantized[f"{prefix}.scales"] = scales
        qconfig = dict(config)
        qconfig["quantization_config"] = (
            {"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm", "zero_point": True}
            if method == "awq"
            else {"quant_method": "gptq", "bits": bits, "group_size": GROUP, "desc_act": False, "sym": False,
                  "checkpoint_format": "gptq"}
        )
        mx.save_safetensors(str(case / "model.safetensors"), {k: mx.array(v) for k, v in quantized.items()},
                            metadata={"format": "pt"})
        (case / "config.json").write_text(json.dumps(qconfig, indent=2))
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (src / f).exists():
                shutil.copy(src / f, case / f)
        # The oracle: mlx-lm on the dense checkpoint of the same (dequantized) weights.
        with tempfile.TemporaryDirectory() as tmp:
            ref = Path(tmp) / "dense"
            shutil.copytree(src, ref)
            mx.save_safetensors(str(ref / "model.safetensors"), {k: mx.array(v) for k, v in dense.items()},
                                metadata={"format": "mlx"})
            record = fx.record_plain_prompt(ref, name, {"oracle": "mlx-lm on the dense f32 checkpoint of the dequantized weights",
                                                        "quantization_config": qconfig["quantization_config"]})
            shutil.copy(ref / "oracle.json", case / "oracle.json")
            shutil.copy(ref / "oracle.safetensors", case / "oracle.safetensors")
        print(name, "min margin", record["min_margin"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
