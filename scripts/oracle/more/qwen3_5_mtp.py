"""Qwen3.5 checkpoints that ship a multi-token-prediction head (`mtp.*`), and what the head answers.

    qwen3_5_mtp.py FIXTURES --tokenizers DIR --gguf FILE

mlx-lm drops a checkpoint's `mtp.*` tensors and has no code for them, so the head is built here
from mlx-lm's own Qwen3.5 classes as vLLM's Qwen3_5MultiTokenPredictor and llama.cpp's
qwen35 `graph_mtp` run it: at position i it reads the target's final (normalized) hidden state
h_i and the embedding of the token x_{i+1}, each through its own RMS norm
(`pre_fc_norm_hidden`, `pre_fc_norm_embedding`), joins them [embedding, hidden], projects them
back to the model's width (`fc`), runs one gated full-attention decoder block (`layers.0`, a
KV cache of its own, the rope position i) and its own norm (`norm`); the target's output head
on that guesses x_{i+2}. Chained, the head's output at i stands in for h_{i+1} with its own guess
as the token.

Writes FIXTURES/qwen3_5_mtp/<case>/ (a subfolder: the generic parity test walks the top level):

- qwen3_5-mtp       the dense 4-layer model of qwen3_5.py (its own random weights) in Hugging
                    Face layout, plus a random `mtp.*` head (norms stored as w for 1 + w, as every
                    norm of the original), config `mtp_num_hidden_layers` 1
- qwen3_5_moe-mtp   the same for the mixture-of-experts model (the head's block has the experts,
                    fused as the original stores them, and the shared expert)

Each has the usual oracle.json (mlx-lm's greedy run; it never reads the head) and mtp.json:
- `sequence`: the prompt's ids and the first CONTINUED greedy tokens;
- `positions`: for each position i < len(sequence) - 1, the head's TOP best logits from (h_i,
  sequence[i + 1]) with the whole sequence's hidden states from one target pass: `ids`, `values`;
- `chains`: for several `start` positions j: the head's cache filled with positions 0..=j as above,
  then CHAIN greedy guesses (the first from position j, each next from the head's own output and
  guess), with each guess's top-1 minus top-2 logit `margins`.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen3_5 as q35  # noqa: E402  (the sibling recording script: its builders, not its main)

fx = q35.fx
mx, np = fx.mx, fx.np

from mlx_lm.models import qwen3_5 as mlx_qwen3_5  # noqa: E402
from mlx_lm.models.base import create_attention_mask  # noqa: E402

CONTINUED = 12
TOP = 8
CHAIN = 4
MTP_SEED = 20261205


class Head(nn.Module):
    """The multi-token-prediction head, from mlx-lm's Qwen3.5 decoder block."""

    def __init__(self, args):
        super().__init__()
        width = args.hidden_size
        self.pre_fc_norm_embedding = nn.RMSNorm(width, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(width, eps=args.rms_norm_eps)
        self.fc = nn.Linear(2 * width, width, bias=False)
        # A full-attention block whatever the model's pattern.
        self.layers = [mlx_qwen3_5.DecoderLayer(args, layer_idx=args.full_attention_interval - 1)]
        self.norm = nn.RMSNorm(width, eps=args.rms_norm_eps)

    def __call__(self, tokens, hidden, embed, cache):
        e = self.pre_fc_norm_embedding(embed(tokens))
        h = self.pre_fc_norm_hidden(hidden)
        x = self.fc(mx.concatenate([e, h], axis=-1))
        x = self.layers[0](x, create_attention_mask(x, cache), cache)
        return self.norm(x)


def head_logits(model, head, tokens, hidden, cache):
    """(the head's output, its logits) for `tokens` [L] after `hidden` [L, H]."""
    lm = model.language_model
    out = head(mx.array([tokens]), hidden[None], lm.model.embed_tokens, cache)
    logits = lm.lm_head(out) if not lm.args.tie_word_embeddings else lm.model.embed_tokens.as_linear(out)
    return out[0], logits[0].astype(mx.float32)


def record_head(model, head, prompt_ids, greedy):
    from mlx_lm.models.cache import KVCache

    seq = prompt_ids + greedy[:CONTINUED]
    hidden = model.language_model.model(mx.array([seq]))[0]
    _, logits = head_logits(model, head, seq[1:], hidden[:-1], KVCache())
    logits = np.array(logits)
    order = np.argsort(-logits, axis=1)[:, :TOP]
    positions = {"ids": order.tolist(),
                 "values": np.take_along_axis(logits, order, axis=1).tolist()}
    chains = []
    for start in (len(prompt_ids) - 2, len(prompt_ids) - 1, len(seq) - 2):
        cache = KVCache()
        out, logits = head_logits(model, head, seq[1:start + 2], hidden[:start + 1], cache)
        guesses, margins = [], []
        h, row = out[-1:], np.array(logits[-1])
        while True:
            top2 = np.sort(row)[-2:]
            guesses.append(int(np.argmax(row)))
            margins.append(float(top2[1] - top2[0]))
            if len(guesses) == CHAIN:
                break
            h, logits = head_logits(model, head, guesses[-1:], h, cache)
            row = np.array(logits[-1])
        chains.append({"start": start, "guesses": guesses, "margins": margins})
    return {"sequence": seq, "positions": positions, "chains": chains}


def make(out, work, tokenizers, case, config):
    mlx_dir, src, _ = q35.make_case(work / "mlx", work, tokenizers, case, config)
    case_dir = out / case
    shutil.rmtree(case_dir, ignore_errors=True)
    shutil.copytree(mlx_dir, case_dir)
    (case_dir / "model.safetensors.index.json").unlink(missing_ok=True)
    hf = q35.to_hf(mx.load(str(mlx_dir / "model.safetensors")))
    # The head, random, in mlx-lm's layout first (the reference runs it so), then as the
    # original stores it: every norm of the head is a (1 + w) norm.
    model, _ = fx.load(str(mlx_dir))
    head = Head(model.language_model.args)
    weights = fx.random_weights(head, MTP_SEED)
    head.load_weights([(k, mx.array(v)) for k, v in weights.items()])
    mtp = {f"mtp.{k}": mx.array(v) for k, v in weights.items()}
    hf.update(q35.to_hf(mtp, shifted=("norm.weight", "norm_embedding.weight", "norm_hidden.weight")))
    mx.save_safetensors(str(case_dir / "model.safetensors"), hf, metadata={"format": "pt"})
    (case_dir / "config.json").write_text(json.dumps(dict(config, mtp_num_hidden_layers=1), indent=2))
    rec = q35.record(case_dir, case, {"source": f"{case} in Hugging Face layout with an mtp.* head",
                                      "weights_seed": int((src / "seed.txt").read_text()),
                                      "mtp_seed": MTP_SEED})
    mtp_rec = record_head(model, head, rec["prompt_ids"], rec["greedy_tokens"])
    (case_dir / "mtp.json").write_text(json.dumps(mtp_rec))
    low = min(m for c in mtp_rec["chains"] for m in c["margins"])
    print(case, "min margin", rec["min_margin"], "head's smallest chain margin", low)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixtures", type=Path)
    ap.add_argument("--tokenizers", type=Path, required=True)
    ap.add_argument("--gguf", type=Path)
    args = ap.parse_args()
    mx.random.seed(0)
    out = args.fixtures / "qwen3_5_mtp"
    out.mkdir(parents=True, exist_ok=True)
    dense, moe = q35.text_configs()
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        (work / "mlx").mkdir()
        make(out, work, args.tokenizers, "qwen3_5-mtp", dense)
        make(out, work, args.tokenizers, "qwen3_5_moe-mtp", moe)


if __name__ == "__main__":
    main()
