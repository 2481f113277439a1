"""`nuvec serve`'s structured outputs through the real OpenAI Python SDK, judged by `jsonschema`
and `re` (both pinned in scripts/serve/requirements.txt):

    python serve_structured.py BASE_URL API_KEY

OpenAI's response_format (json_schema with strict, json_object), vLLM's structured_outputs
extension (regex, choice), streamed and whole, greedy and sampled, and a schema the server
cannot use (a 400 naming the parameter). Run by crates/nuvec-cli/tests/serve.rs on the default
SmolLM2 model. Every check raises on failure; the last line is "ok".
"""

import json
import re
import sys

import jsonschema
import openai

base_url, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
model = client.models.list().data[0].id


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def ask(text, **kwargs):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=120, **kwargs
    )


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "languages": {"type": "array", "items": {"enum": ["en", "fr", "de"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}

# json_schema, greedy then sampled with seeds: every answer valid, ended by the grammar.
for kwargs in [dict(temperature=0)] + [dict(temperature=1.0, seed=s) for s in range(4)]:
    r = ask("Describe a person as JSON.", response_format=fmt, **kwargs)
    content = r.choices[0].message.content
    jsonschema.validate(json.loads(content), PERSON)
    check(r.choices[0].finish_reason == "stop", r)
    print("json_schema:", content)

# The same, streamed: the pieces join into valid JSON.
stream = ask("Describe a person as JSON.", response_format=fmt, temperature=0, stream=True)
text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
jsonschema.validate(json.loads(text), PERSON)

# json_object: some JSON object.
r = ask("A JSON object with one key, city.", response_format={"type": "json_object"}, temperature=0)
check(isinstance(json.loads(r.choices[0].message.content), dict), r)

# vLLM's structured_outputs: a regex and a choice.
rx = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
r = ask("What is today's date?", extra_body={"structured_outputs": {"regex": rx}}, temperature=0)
check(re.fullmatch(rx, r.choices[0].message.content), r)
r = ask("Is the sky blue?", extra_body={"structured_outputs": {"choice": ["yes", "no"]}}, temperature=0)
check(r.choices[0].message.content in ("yes", "no"), r)
print("regex and choice:", r.choices[0].message.content)

# The Responses API's text.format: the schema beside its type; the response echoes it.
resp = client.responses.create(
    model=model,
    input="Describe a person as JSON.",
    max_output_tokens=120,
    temperature=0,
    text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}},
)
jsonschema.validate(json.loads(resp.output_text), PERSON)
check(resp.text.format.type == "json_schema", resp.text)
print("responses:", resp.output_text)

# A schema keyword the grammar engine does not implement: a 400 naming the parameter.
bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}}
try:
    ask("x", response_format=bad)
    raise AssertionError("an unusable schema was accepted")
except openai.BadRequestError as e:
    check(e.body.get("param") == "response_format.json_schema.schema", e.body)
    check("uniqueItems" in e.body.get("message", ""), e.body)

print("ok")
