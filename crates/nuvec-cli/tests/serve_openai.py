"""`nuvec serve` through the real OpenAI Python SDK (pinned in scripts/serve/requirements.txt):
models, chat completions (with n = 2 choices too), completions and the Responses API.

    python serve_openai.py BASE_URL API_KEY EXPECTED_CHAT_ANSWER

Run by crates/nuvec-cli/tests/serve.rs against a server started with `--api-key API_KEY` on the
default SmolLM2 model; EXPECTED_CHAT_ANSWER is what `nuvec generate` answers (greedy, 40 tokens) to
"What is the capital of France?" (the same greedy answer comes from chat completions and
from /v1/responses). Every check raises on failure; the last line is "ok".
"""

import math
import sys

import openai

base_url, key, expected = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


# Models: the served id, which requests may name.
models = client.models.list()
ids = [m.id for m in models.data]
check(len(ids) == 1, f"one model is served: {ids}")
model = ids[0]

# Chat, whole: the same greedy answer as `nuvec generate`.
chat = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=40, temperature=0)
choice = chat.choices[0]
check(choice.message.role == "assistant", chat)
check(choice.message.content == expected, f"{choice.message.content!r} != {expected!r}")
check(choice.finish_reason in ("stop", "length"), chat)
usage = chat.usage
check(usage.prompt_tokens > 0 and usage.completion_tokens > 0, usage)
check(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage)
check(chat.object == "chat.completion" and chat.id.startswith("chatcmpl-"), chat)
print("chat:", repr(choice.message.content))

# Chat, streamed with a usage chunk: the same text, in pieces.
stream = client.chat.completions.create(
    model=model,
    messages=QUESTION,
    max_tokens=40,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
pieces, finish, final_usage, roles = [], None, None, []
for chunk in stream:
    check(chunk.object == "chat.completion.chunk", chunk)
    if chunk.usage is not None:
        check(chunk.choices == [], f"the usage chunk has no choices: {chunk}")
        final_usage = chunk.usage
        continue
    delta = chunk.choices[0].delta
    if delta.role:
        roles.append(delta.role)
    if delta.content:
        pieces.append(delta.content)
    if chunk.choices[0].finish_reason:
        finish = chunk.choices[0].finish_reason
check(roles == ["assistant"], roles)
check("".join(pieces) == expected, f"{''.join(pieces)!r} != {expected!r}")
check(len(pieces) > 1, f"streamed in pieces: {pieces}")
check(finish == choice.finish_reason, finish)
check(final_usage is not None and final_usage.completion_tokens == usage.completion_tokens, final_usage)
check(final_usage.prompt_tokens == usage.prompt_tokens, final_usage)

# Two choices, whole and streamed: greedy, so each is the one answer; the usage sums them.
two = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=40, temperature=0, n=2)
check([c.index for c in two.choices] == [0, 1], two)
check(all(c.message.content == expected for c in two.choices), two)
check(two.usage.completion_tokens == 2 * usage.completion_tokens, two.usage)
check(two.usage.prompt_tokens == usage.prompt_tokens, two.usage)
stream = client.chat.completions.create(
    model=model, messages=QUESTION, max_tokens=40, temperature=0, n=2, stream=True
)
texts, finishes = {0: [], 1: []}, {}
for chunk in stream:
    check(len(chunk.choices) == 1, chunk)
    c = chunk.choices[0]
    texts[c.index].append(c.delta.content or "")
    if c.finish_reason:
        finishes[c.index] = c.finish_reason
check(all("".join(texts[i]) == expected for i in (0, 1)), texts)
check(finishes == {0: choice.finish_reason, 1: choice.finish_reason}, finishes)
print("n=2:", [c.message.content == expected for c in two.choices])

# Content as a list of text parts, and a system message: accepted.
parts = client.chat.completions.create(
    messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}]},
    ],
    model=model,
    max_completion_tokens=40,
)
check("Paris" in parts.choices[0].message.content, parts)

# Chat logprobs: one entry per token, the greedy token the most likely, top_logprobs as asked.
lp = client.chat.completions.create(
    model=model, messages=QUESTION, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3
)
content = lp.choices[0].logprobs.content
check(len(content) == lp.usage.completion_tokens, f"{len(content)} entries for {lp.usage.completion_tokens} tokens")
check("".join(e.token for e in content).startswith(lp.choices[0].message.content[:5]), content)
for e in content:
    check(e.logprob <= 0 and math.isfinite(e.logprob), e)
    check(len(e.top_logprobs) == 3, e)
    check(e.top_logprobs[0].token == e.token, f"greedy picks the most likely: {e}")
    check(abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, e)
    check(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob, e)
    check(bytes(e.bytes).decode("utf-8", "replace") == e.token, e)
print("logprobs:", [(e.token, round(e.logprob, 3)) for e in content[:4]])

# Completions, whole and streamed: the same text.
prompt = "The capital of France is"
whole = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0)
text = whole.choices[0].text
check("Paris" in text, whole)
check(whole.usage.completion_tokens == 16 or whole.choices[0].finish_reason == "stop", whole)
streamed = "".join(
    c.choices[0].text for c in client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0, stream=True)
)
check(streamed == text, f"{streamed!r} != {text!r}")
print("completion:", repr(text))

# Completions from token ids, with stop strings and legacy logprobs.
ids_prompt = client.completions.create(model=model, prompt=[504, 3575, 282, 4649, 314], max_tokens=5, logprobs=2)
check(ids_prompt.usage.prompt_tokens == 5, ids_prompt.usage)
lps = ids_prompt.choices[0].logprobs
check(len(lps.tokens) == len(lps.token_logprobs) == len(lps.top_logprobs) == ids_prompt.usage.completion_tokens, lps)
check(all(len(t) == 2 for t in lps.top_logprobs), lps)
stopped = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0, stop=["."])
check(stopped.choices[0].finish_reason == "stop", stopped)
check(stopped.choices[0].text == text.split(".")[0], f"{stopped.choices[0].text!r} vs {text!r}")

# Seeded sampling: the same seed gives the same text.
a, b = (
    client.chat.completions.create(model=model, messages=QUESTION, max_tokens=20, temperature=0.9, seed=7)
    for _ in range(2)
)
check(a.choices[0].message.content == b.choices[0].message.content, (a, b))

# Responses, whole: the same greedy answer as chat completions, as one message's output_text.
resp = client.responses.create(model=model, input=QUESTION[0]["content"], max_output_tokens=40, temperature=0)
check(resp.object == "response" and resp.id.startswith("resp_"), resp)
check(resp.output_text == expected, f"responses: {resp.output_text!r} != {expected!r}")
check([item.type for item in resp.output] == ["message"], resp.output)
check(resp.output[0].content[0].type == "output_text", resp.output)
check(resp.status == ("completed" if choice.finish_reason == "stop" else "incomplete"), resp)
check(resp.usage.input_tokens == usage.prompt_tokens, resp.usage)
check(resp.usage.output_tokens == usage.completion_tokens, resp.usage)
check(resp.usage.total_tokens == usage.total_tokens, resp.usage)
print("responses:", repr(resp.output_text))

# Responses, streamed: typed events, numbered in order, whose deltas are the same text.
events = list(
    client.responses.create(model=model, input=QUESTION, max_output_tokens=40, temperature=0, stream=True)
)
kinds = [e.type for e in events]
check(kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"], kinds)
check(kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"], kinds)
check([e.sequence_number for e in events] == list(range(len(events))), kinds)
deltas = [e for e in events if e.type == "response.output_text.delta"]
check(all(type(e).__name__ == "ResponseTextDeltaEvent" for e in deltas), [type(e) for e in deltas])
check("".join(e.delta for e in deltas) == expected, deltas)
check(len(deltas) > 1, f"streamed in pieces: {deltas}")
check(events[-1].response.output_text == expected, events[-1])

# The SDK's stream helper, which checks that the events build the final response.
with client.responses.stream(model=model, input=QUESTION, max_output_tokens=40, temperature=0) as helper:
    pieces = [e.delta for e in helper if e.type == "response.output_text.delta"]
    final = helper.get_final_response()
check("".join(pieces) == expected and final.output_text == expected, (pieces, final))
try:
    client.responses.create(model=model, input="hi", previous_response_id="resp_0")
    raise AssertionError("previous_response_id was accepted")
except openai.BadRequestError as e:
    check(e.body["param"] == "previous_response_id" and "no state" in e.message, e.body)

# Errors, as the SDK's exception types.
try:
    client.chat.completions.create(model=model, messages=QUESTION, temperature=-1)
    raise AssertionError("temperature -1 was accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400, e)
    check(e.body["param"] == "temperature", e.body)
try:
    client.chat.completions.create(model=model, messages=QUESTION, n=17)
    raise AssertionError("n=17 was accepted")
except openai.BadRequestError as e:
    check(e.body["param"] == "n", e.body)
try:
    client.chat.completions.create(model="gpt-4o", messages=QUESTION)
    raise AssertionError("another model was accepted")
except openai.NotFoundError as e:
    check(e.body["code"] == "model_not_found", e.body)
try:
    openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as e:
    check(e.status_code == 401, e)
print("ok")
