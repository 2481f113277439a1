"""What mlx-lm prints for generated tokens: its streaming detokenizer's text, token by token.

    detokenize.py FIXTURES --tokenizers DIR --gguf FILE

mlx_lm.generate prints the text of `TokenizerWrapper.detokenizer` (the class mlx-lm picks from
tokenizer.json's decoder: BPEStreamingDetokenizer for byte-level BPE, which drops the first
piece's leading space; SPMStreamingDetokenizer for SentencePiece; NaiveStreamingDetokenizer
otherwise). For each npm tokenizer it writes FIXTURES/detokenize/<name>.json: the class, and per
case the token ids (as a generation would yield them) and the concatenated text mlx-lm's
detokenizer streams for them (each `last_segment` after `add_token`, then `finalize`).
"""

import argparse
import json
from pathlib import Path

from mlx_lm.tokenizer_utils import load as load_tokenizer_wrapper

# Texts a model might generate: a leading space (the case mlx-lm trims), two, none, a newline
# first, multi-byte characters split across tokens, and a space alone.
TEXTS = [
    " EST EST EST",
    " Paris is the capital of France.",
    "  two spaces first",
    "No space first",
    "\nA newline first",
    " café, naïve, 日本語 🙂",
    " ",
    " x",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixtures", type=Path)
    ap.add_argument("--tokenizers", type=Path, required=True)
    ap.add_argument("--gguf", type=Path)
    args = ap.parse_args()
    out = args.fixtures / "detokenize"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("qwen3", "llama3_1", "gptoss", "llama2", "gemma3"):
        wrapper = load_tokenizer_wrapper(args.tokenizers / name)
        cases = []
        for text in TEXTS:
            ids = wrapper.encode(text, add_special_tokens=False)
            detok = wrapper.detokenizer
            detok.reset()
            streamed = ""
            for i in ids:
                detok.add_token(i)
                streamed += detok.last_segment
            detok.finalize()
            streamed += detok.last_segment
            cases.append({"text": text, "ids": ids, "printed": streamed})
        record = {"detokenizer": type(wrapper.detokenizer).__name__, "cases": cases}
        (out / f"{name}.json").write_text(json.dumps(record, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
