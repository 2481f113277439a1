"""Greedy generation with mlx-lm, for tests that check a checkpoint nuvec wrote loads in mlx-lm.

    mlx_generate.py CHECKPOINT_DIR (chat|raw) MAX_TOKENS PROMPT

Prints {"prompt_ids": [...], "tokens": [...]} as mlx_lm.generate would produce them: with the
chat template (add_generation_prompt, then encoded without special tokens) or the raw prompt
(encoded with them); greedy; stopping at the tokenizer's end-of-sequence ids.
"""

import json
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

path, mode, max_tokens, prompt = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
model, tokenizer = load(path)
if mode == "chat":
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
else:
    ids = tokenizer.encode(prompt)
tokens = []
for (token, _), _ in zip(generate_step(mx.array(ids), model, sampler=make_sampler(0.0)), range(max_tokens)):
    token = int(token)
    if token in tokenizer.eos_token_ids:
        break
    tokens.append(token)
print(json.dumps({"prompt_ids": ids, "tokens": tokens}))
