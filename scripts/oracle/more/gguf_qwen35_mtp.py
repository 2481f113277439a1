"""A Qwen3.5 GGUF that keeps its multi-token-prediction block, as llama.cpp's converter writes an
original's `mtp.*` by default (conversion/qwen.py, _QwenMtpMixin), and what the head answers.

    gguf_qwen35_mtp.py FIXTURES --tokenizers DIR --gguf FILE

Writes FIXTURES/gguf-qwen35-mtp/: model.gguf is gguf_qwen35.py's dense model (qwen35) with one
more block past the decoder's: `block_count` counts it, `nextn_predict_layers` is 1, and it holds
a gated full-attention decoder block (`blk.4.attn_*`, `blk.4.ffn_*`, its norms) and the head's
own tensors (`blk.4.nextn.eh_proj`, the `fc` over [embedding, hidden]; `nextn.enorm`,
`nextn.hnorm`, `nextn.shared_head_norm`, its norms, stored 1 + w as every norm of the file).
oracle.json / oracle.safetensors are mlx-lm's greedy run on the dense checkpoint (mlx-lm drops
`mtp.*`); mtp.json is qwen3_5_mtp.py's record of the head (built from mlx-lm's classes) on the
dense f32 values of the file's tensors.
"""

import json
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_qwen35 as g  # noqa: E402
import qwen3_5_mtp as head_record  # noqa: E402

gm, fx = g.gm, head_record.fx
mx = fx.mx
T = g.T
CASE = "gguf-qwen35-mtp"


def model_tensors(seed):
    """gguf_qwen35.py's dense model and a multi-token-prediction block after its layers."""
    tensors, dense = g.tensors_for(False)(seed)
    t = gm.Tensors(seed + 1)
    i, p = g.LAYERS, "mtp.layers.0"
    t.norm(f"blk.{i}.attn_norm.weight", f"{p}.input_layernorm.weight", g.HIDDEN)
    t.norm(f"blk.{i}.post_attention_norm.weight", f"{p}.post_attention_layernorm.weight", g.HIDDEN)
    g.full_attention(t, i, p)
    g.feed_forward(t, i, p, False)
    t.matrix(f"blk.{i}.nextn.eh_proj.weight", "mtp.fc.weight", T.Q8_0, (g.HIDDEN, 2 * g.HIDDEN),
             2.5 / math.sqrt(2 * g.HIDDEN))
    t.norm(f"blk.{i}.nextn.enorm.weight", "mtp.pre_fc_norm_embedding.weight", g.HIDDEN)
    t.norm(f"blk.{i}.nextn.hnorm.weight", "mtp.pre_fc_norm_hidden.weight", g.HIDDEN)
    t.norm(f"blk.{i}.nextn.shared_head_norm.weight", "mtp.norm.weight", g.HIDDEN)
    tensors.update(t.gguf)
    dense.update(t.dense)
    return tensors, dense


def record_mtp(case_dir, reader):
    oracle = json.loads((case_dir / "oracle.json").read_text())
    _, dense = model_tensors(oracle["weights_seed"])
    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(tmp) / "dense"
        gm.write_dense(ref, dense, g.config_for(False)(reader), reader)
        model, _ = fx.load(str(ref))
        head = head_record.Head(model.language_model.args)
        head.load_weights([(k[len("mtp."):], mx.array(v)) for k, v in dense.items() if k.startswith("mtp.")])
        rec = head_record.record_head(model, head, oracle["prompt_ids"], oracle["greedy_tokens"])
    (case_dir / "mtp.json").write_text(json.dumps(rec))
    low = min(m for c in rec["chains"] for m in c["margins"])
    print(f"[{CASE}] head's smallest chain margin {low:.3f}", flush=True)


def main():
    gm.main(__doc__, CASE, model_tensors, g.config_for(False), g.writer_for(False, mtp_layers=1), g.SEED_TRIALS,
            "mlx-lm on the dense f32 checkpoint of gguf-py's dequantized weights, value heads grouped")
    fixtures = Path(sys.argv[1]).resolve()
    import gguf

    reader = gguf.GGUFReader(sys.argv[sys.argv.index("--gguf") + 1])
    record_mtp(fixtures / CASE, reader)


if __name__ == "__main__":
    sys.exit(main())
