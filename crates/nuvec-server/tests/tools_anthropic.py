"""Tool use through the real Anthropic Python SDK (pinned in scripts/serve/requirements.txt) on
the Messages API.

    python tools_anthropic.py BASE_URL

Run by crates/nuvec-server/tests/tools.rs against the same scripted server as tools_openai.py:
to a question it answers with reasoning and a get_weather call for Paris, to a prompt holding a
tool result with "It is 21 °C in Paris.". Every check raises on failure; the last line is "ok".
"""

import json
import sys

import anthropic

client = anthropic.Anthropic(base_url=sys.argv[1], api_key="none", max_retries=0, timeout=60)
TOOLS = [{
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]
QUESTION = [{"role": "user", "content": "What's the weather in Paris?"}]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


# Whole: a tool_use block with the parsed input, stop_reason tool_use.
r = client.messages.create(model="scripted", max_tokens=200, messages=QUESTION, tools=TOOLS)
check(r.stop_reason == "tool_use", r)
uses = [b for b in r.content if b.type == "tool_use"]
check(len(uses) == 1 and uses[0].name == "get_weather" and uses[0].input == {"city": "Paris"}, r.content)
check(uses[0].id.startswith("toolu_") or uses[0].id, uses)
check(not [b for b in r.content if b.type == "text" and b.text.strip()], r.content)
print("call:", uses[0].name, json.dumps(uses[0].input))

# Streamed: the SDK's accumulated message holds the same call.
with client.messages.stream(model="scripted", max_tokens=200, messages=QUESTION, tools=TOOLS) as stream:
    final = stream.get_final_message()
streamed = [(b.name, b.input) for b in final.content if b.type == "tool_use"]
check(streamed == [("get_weather", {"city": "Paris"})], final.content)
check(final.stop_reason == "tool_use", final)

# The round trip: the assistant turn as the SDK returned it, then the tool_result.
messages = QUESTION + [
    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": uses[0].id, "content": json.dumps({"temperature": 21})},
    ]},
]
r = client.messages.create(model="scripted", max_tokens=200, messages=messages, tools=TOOLS)
texts = [b.text for b in r.content if b.type == "text"]
check(texts == ["It is 21 °C in Paris."], r.content)
check(r.stop_reason == "end_turn", r)
print("ok")
