"""`nuvec serve`'s /v1/messages through the real Anthropic Python SDK (pinned in
scripts/serve/requirements.txt).

    python serve_anthropic.py BASE_URL API_KEY MODEL EXPECTED_CHAT_ANSWER

Run by crates/nuvec-cli/tests/serve.rs against a server started with `--api-key API_KEY` on the
default SmolLM2 model (the SDK sends the key as `x-api-key`); EXPECTED_CHAT_ANSWER is what
`nuvec generate` answers (greedy, 40 tokens) to "What is the capital of France?". Every check
raises on failure; the last line is "ok".
"""

import sys

import anthropic

base_url, key, model, expected = sys.argv[1:5]
client = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=120)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


# Whole: the same greedy answer, as one text block.
msg = client.messages.create(model=model, max_tokens=40, extra_body={"temperature": 0}, messages=QUESTION)
check(msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_"), msg)
check([b.type for b in msg.content] == ["text"], msg.content)
check(msg.content[0].text == expected, f"{msg.content[0].text!r} != {expected!r}")
check(msg.stop_reason == "end_turn" and msg.stop_sequence is None, msg)
prompt_tokens = msg.usage.input_tokens + msg.usage.cache_read_input_tokens
check(prompt_tokens > 0 and 0 < msg.usage.output_tokens <= 40, msg.usage)
print("messages:", repr(msg.content[0].text))

# Streamed, raw events: their order, and the same text in pieces.
events = list(client.messages.create(model=model, max_tokens=40, extra_body={"temperature": 0}, messages=QUESTION, stream=True))
kinds = [e.type for e in events]
check(kinds[:2] == ["message_start", "content_block_start"], kinds)
check(kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds)
check(set(kinds[2:-3]) == {"content_block_delta"}, kinds)
pieces = [e.delta.text for e in events if e.type == "content_block_delta"]
check("".join(pieces) == expected and len(pieces) > 1, pieces)
check(events[-2].delta.stop_reason == "end_turn", events[-2])
check(events[-2].usage.output_tokens == msg.usage.output_tokens, events[-2].usage)

# The SDK's stream helper, which builds the final message from the events.
with client.messages.stream(model=model, max_tokens=40, extra_body={"temperature": 0}, messages=QUESTION) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
check(text == expected and final.content[0].text == expected, (text, final))
check(final.stop_reason == "end_turn" and final.usage.output_tokens == msg.usage.output_tokens, final)

# A system prompt as text blocks is accepted; a stop sequence ends the answer before it.
cut = client.messages.create(
    model=model,
    max_tokens=40,
    extra_body={"temperature": 0},
    system=[{"type": "text", "text": "You are a helpful assistant."}],
    messages=QUESTION,
)
check("Paris" in cut.content[0].text, cut)
stopped = client.messages.create(model=model, max_tokens=40, extra_body={"temperature": 0}, messages=QUESTION, stop_sequences=["Paris"])
check(stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "Paris", stopped)
check(stopped.content[0].text == expected.split("Paris")[0], f"{stopped.content[0].text!r} vs {expected!r}")
short = client.messages.create(model=model, max_tokens=3, extra_body={"temperature": 0}, messages=QUESTION)
check(short.stop_reason == "max_tokens" and short.usage.output_tokens == 3, short)

# count_tokens counts the prompt the request would give.
counted = client.messages.count_tokens(model=model, messages=QUESTION)
check(counted.input_tokens == prompt_tokens, (counted, msg.usage))

# Errors, as the SDK's exception types, in Anthropic's shape.
try:
    client.messages.create(model=model, max_tokens=40, extra_body={"temperature": -1}, messages=QUESTION)
    raise AssertionError("temperature -1 was accepted")
except anthropic.BadRequestError as e:
    check(e.status_code == 400 and e.body["type"] == "error", e.body)
    check(e.body["error"]["type"] == "invalid_request_error" and "temperature" in e.body["error"]["message"], e.body)
try:
    # The SDK will not send a request without max_tokens; a raw POST does.
    client.post("/v1/messages", body={"model": model, "messages": QUESTION}, cast_to=object)
    raise AssertionError("a request without max_tokens was accepted")
except anthropic.BadRequestError as e:
    check("max_tokens is required" in e.body["error"]["message"], e.body)
try:
    client.messages.create(model="claude-sonnet-4-5", max_tokens=40, messages=QUESTION)
    raise AssertionError("another model was accepted")
except anthropic.NotFoundError as e:
    check(e.body["error"]["type"] == "not_found_error", e.body)
try:
    anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0).messages.create(
        model=model, max_tokens=5, messages=QUESTION
    )
    raise AssertionError("a wrong key was accepted")
except anthropic.AuthenticationError as e:
    check(e.status_code == 401 and e.body["error"]["type"] == "authentication_error", e.body)
print("ok")
