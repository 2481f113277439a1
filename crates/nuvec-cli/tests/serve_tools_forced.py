"""Forced tool calls through the real OpenAI Python SDK, judged by `jsonschema`:

    python serve_tools_forced.py BASE_URL API_KEY

tool_choice "required" and a named function, greedy and sampled, whole and streamed, on a
random Qwen3 model served with Qwen3's chat template (its `<tool_call>` markup): every answer is
exactly one call of an offered tool (the named one when named) whose arguments are valid under
the tool's `parameters`, with finish_reason "tool_calls". Run by crates/nuvec-cli/tests/serve.rs.
Every check raises on failure; the last line is "ok".
"""

import json
import sys

import jsonschema
import openai

base_url, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
model = client.models.list().data[0].id

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS = [
    {"type": "function", "function": {"name": n, "description": "A tool.", "parameters": s}}
    for n, s in SCHEMAS.items()
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris, and the time?"}]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def check_call(calls, finish, named, what):
    check(finish == "tool_calls", f"{what}: finish_reason {finish!r}")
    check(calls is not None and len(calls) == 1, f"{what}: calls {calls!r}")
    name, arguments = calls[0]
    check(name in SCHEMAS, f"{what}: called {name!r}")
    check(named is None or name == named, f"{what}: called {name!r}, not {named!r}")
    try:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    except Exception as e:
        raise AssertionError(f"{what}: arguments {arguments!r}: {e}")


for named in [None, "get_time", "get_weather"]:
    choice = "required" if named is None else {"type": "function", "function": {"name": named}}
    for kwargs in [dict(temperature=0)] + [dict(temperature=1.0, seed=s) for s in range(3)]:
        what = f"tool_choice {choice!r} {kwargs}"
        r = client.chat.completions.create(
            model=model, messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=120, **kwargs
        )
        m = r.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
        check_call(calls, r.choices[0].finish_reason, named, what)
        # Streamed: the same call, in pieces.
        parts, finish = {}, None
        for chunk in client.chat.completions.create(
            model=model, messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=120, stream=True, **kwargs
        ):
            for c in chunk.choices:
                for t in c.delta.tool_calls or []:
                    p = parts.setdefault(t.index, ["", ""])
                    p[0] += (t.function.name or "") if t.function else ""
                    p[1] += (t.function.arguments or "") if t.function else ""
                finish = c.finish_reason or finish
        streamed = [tuple(parts[i]) for i in sorted(parts)]
        check_call(streamed, finish, named, what + " streamed")
        check(streamed == calls, f"{what}: streamed {streamed!r} but whole {calls!r}")

# A schema the grammar cannot take is a 400 naming the tools.
bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "uniqueItems": True, "properties": {"a": {"type": "array", "uniqueItems": True}}}}}]
try:
    client.chat.completions.create(model=model, messages=MESSAGES, tools=bad, tool_choice="required", max_tokens=20)
    raise AssertionError("a schema the grammar cannot take was accepted")
except openai.BadRequestError as e:
    check(e.body.get("param") == "tools", f"param {e.body!r}")
print("ok")
