"""Served adapters (`nuvec serve --lora-modules NAME=PATH`) through the real OpenAI Python SDK:
/v1/models lists the base model and each adapter (with the base as its parent); completions
naming each, sent at once so they share the Batcher's steps, get what `nuvec generate` answers
alone with that adapter (`--adapter-path`) or without one; a model not served is a 404 naming
those that are.

    python serve_adapters.py BASE_URL EXPECTED_JSON

EXPECTED_JSON maps each served id to `nuvec generate`'s greedy 12-token continuation of
"hello world" (printed without its first leading space). Run by
crates/nuvec-cli/tests/serve_adapters.rs; every check raises on failure; the last line is "ok".
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import openai

base_url, expected = sys.argv[1], json.loads(sys.argv[2])
client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=300)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


models = client.models.list().data
ids = [m.id for m in models]
check(sorted(ids) == sorted(expected), f"served ids {ids}, expected {sorted(expected)}")
base = ids[0]
for m in models[1:]:
    check(getattr(m, "parent", None) == base, f"{m} has no parent {base}")
check(client.models.retrieve(ids[1]).id == ids[1], "an adapter's card")


def complete(model):
    answer = client.completions.create(model=model, prompt="hello world", max_tokens=12, temperature=0)
    check(answer.model == model, f"answered as {answer.model}, asked {model}")
    text = answer.choices[0].text
    return model, text[1:] if text.startswith(" ") else text


asked = ids + ids[::-1]
with ThreadPoolExecutor(len(asked)) as pool:
    for model, text in pool.map(complete, asked):
        check(text == expected[model], f"{model}: {text!r} != {expected[model]!r}")
        print(f"{model}: {text!r}")

# Streamed, under the adapter's name.
chunks = list(client.completions.create(model=ids[1], prompt="hello world", max_tokens=12, temperature=0, stream=True))
check(all(c.model == ids[1] for c in chunks), "stream chunks name the adapter")
text = "".join(c.choices[0].text for c in chunks if c.choices)
check((text[1:] if text.startswith(" ") else text) == expected[ids[1]], f"streamed {text!r}")

try:
    client.completions.create(model="not-served", prompt="hello world", max_tokens=2)
    raise AssertionError("a model not served was answered")
except openai.NotFoundError as e:
    check(all(f"`{i}`" in str(e) for i in ids), f"the 404 names the served ids: {e}")
print("ok")
