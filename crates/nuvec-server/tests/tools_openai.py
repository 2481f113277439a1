"""Tool calls through the real OpenAI Python SDK (pinned in scripts/serve/requirements.txt), on
chat completions and on the Responses API.

    python tools_openai.py BASE_URL

Run by crates/nuvec-server/tests/tools.rs against a server with Qwen3's tokenizer and template
over a scripted engine: to a question it answers with reasoning and a get_weather call for
Paris, to a prompt holding a tool response with reasoning and "It is 21 °C in Paris.". Every
check raises on failure; the last line is "ok".
"""

import json
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="none", max_retries=0, timeout=60)
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
QUESTION = [{"role": "user", "content": "What's the weather in Paris?"}]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


# Whole: the call parsed, no markup in the content, the reasoning in its field.
r = client.chat.completions.create(model="scripted", messages=QUESTION, tools=TOOLS, tool_choice="auto")
choice = r.choices[0]
check(choice.finish_reason == "tool_calls", choice)
calls = choice.message.tool_calls
check(len(calls) == 1 and calls[0].type == "function", calls)
check(calls[0].function.name == "get_weather", calls)
check(json.loads(calls[0].function.arguments) == {"city": "Paris"}, calls)
check(calls[0].id.startswith("call_"), calls)
check(choice.message.content is None, choice.message)
check(choice.message.model_extra.get("reasoning_content") == "I need the weather.", choice.message)
print("call:", calls[0].function.name, calls[0].function.arguments)

# Streamed: the call's deltas put together as the SDK's users do.
stream = client.chat.completions.create(model="scripted", messages=QUESTION, tools=TOOLS, stream=True)
names, args, ids, content, reasoning, finish = {}, {}, {}, "", "", None
for chunk in stream:
    delta = chunk.choices[0].delta
    content += delta.content or ""
    reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
    for tc in delta.tool_calls or []:
        if tc.id:
            ids[tc.index] = tc.id
        if tc.function and tc.function.name:
            names[tc.index] = tc.function.name
        if tc.function and tc.function.arguments:
            args[tc.index] = args.get(tc.index, "") + tc.function.arguments
    finish = chunk.choices[0].finish_reason or finish
check(names == {0: "get_weather"} and json.loads(args[0]) == {"city": "Paris"}, (names, args))
check(content == "" and reasoning == "I need the weather.", (content, reasoning))
check(finish == "tool_calls", finish)

# The round trip: the call as the SDK returned it, and its result.
messages = QUESTION + [
    choice.message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True),
    {"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"temperature": 21})},
]
r = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)
check(r.choices[0].message.content == "It is 21 °C in Paris.", r)
check(r.choices[0].finish_reason == "stop", r)
check(r.choices[0].message.tool_calls is None, r)

# A named tool_choice and an unknown one.
r = client.chat.completions.create(
    model="scripted", messages=messages, tools=TOOLS,
    tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=5,
)
check(r.choices[0].finish_reason in ("length", "stop", "tool_calls"), r)
try:
    client.chat.completions.create(model="scripted", messages=QUESTION, tools=TOOLS,
                                   tool_choice={"type": "function", "function": {"name": "nope"}})
    raise AssertionError("an unknown tool was accepted")
except openai.BadRequestError as e:
    check(e.body["param"] == "tool_choice", e.body)

# The Responses API: tools in its flat shape, the call as a function_call item, and the round
# trip with the call and a function_call_output item.
RESPONSE_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]
r = client.responses.create(model="scripted", input="What's the weather in Paris?", tools=RESPONSE_TOOLS)
calls = [item for item in r.output if item.type == "function_call"]
check(len(calls) == 1 and calls[0].name == "get_weather", r.output)
check(json.loads(calls[0].arguments) == {"city": "Paris"}, calls)
check(r.output_text == "", r.output)
with client.responses.stream(model="scripted", input="What's the weather in Paris?", tools=RESPONSE_TOOLS) as stream:
    kinds = [event.type for event in stream]
    streamed = stream.get_final_response()
check("response.function_call_arguments.done" in kinds, kinds)
streamed_calls = [item for item in streamed.output if item.type == "function_call"]
check([(c.name, json.loads(c.arguments)) for c in streamed_calls] == [("get_weather", {"city": "Paris"})], streamed)
items = [
    {"role": "user", "content": "What's the weather in Paris?"},
    calls[0].model_dump(include={"type", "call_id", "name", "arguments"}),
    {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"temperature": 21})},
]
r = client.responses.create(model="scripted", input=items, tools=RESPONSE_TOOLS)
check(r.output_text == "It is 21 °C in Paris.", r.output)
check(not [item for item in r.output if item.type == "function_call"], r.output)
print("responses call:", calls[0].name, calls[0].arguments)
print("ok")
