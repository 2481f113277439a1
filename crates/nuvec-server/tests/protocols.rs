//! `/v1/responses` (OpenAI's Responses API) and `/v1/messages` (Anthropic's Messages API)
//! over real tokenizers and chat templates and a scripted engine (tests/common): each protocol's
//! request renders the same prompt as the chat completions request that says the same, its
//! answer's reasoning, text and tool calls come back in its own shape, whole and as its typed
//! event stream (checked for order and numbering), and bad input gets a 400 naming the field,
//! in the protocol's error shape. The real SDKs against the real model are in
//! crates/nuvec-cli/tests/serve.rs.

use axum::http::StatusCode;
use serde_json::{json, Value};

mod common;
use common::{fixture, post, runtime, says, serve, serve_keyed, Served};

const QWEN_CALLS: &str = "<think>\nThe user wants the weather in Paris.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Paris «météo»\"}}\n</tool_call>";
const QUESTION: &str = "What's the weather in Paris?";

fn chat_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "search", "description": "Search the web",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}},
    ])
}

/// The same tools in Responses' flat shape.
fn responses_tools() -> Value {
    let tools: Vec<Value> = chat_tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let f = &t["function"];
            json!({"type": "function", "name": f["name"], "description": f["description"], "parameters": f["parameters"]})
        })
        .collect();
    Value::Array(tools)
}

/// The same tools in Anthropic's shape.
fn anthropic_tools() -> Value {
    let tools: Vec<Value> = chat_tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let f = &t["function"];
            json!({"name": f["name"], "description": f["description"], "input_schema": f["parameters"]})
        })
        .collect();
    Value::Array(tools)
}

async fn ok(app: &axum::Router, path: &str, body: &Value) -> Value {
    let (status, text) = post(app, path, body, &[]).await;
    assert_eq!(status, StatusCode::OK, "{path} {body}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The prompt (token ids) the server gave the engine for `body` at `path`.
async fn prompt_of(served: &Served, path: &str, body: &Value) -> Vec<u32> {
    ok(&served.server.router(), path, body).await;
    served.last_prompt()
}

/// A stream's events as (event name, data), checked: each data's `type` is its event name.
fn sse(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let field = |name: &str| {
                block.lines().find_map(|l| l.strip_prefix(name)).unwrap_or_else(|| panic!("no {name} in {block:?}"))
            };
            let (event, data) = (field("event: ").to_string(), field("data: "));
            let data: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
            assert_eq!(data["type"], event.as_str(), "{block}");
            (event, data)
        })
        .collect()
}

async fn stream(app: &axum::Router, path: &str, body: &Value) -> Vec<(String, Value)> {
    let mut body = body.clone();
    body["stream"] = true.into();
    let (status, text) = post(app, path, &body, &[]).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    sse(&text)
}

/// `items` without their `id`s (each request mints its own).
fn without_ids(items: &Value) -> Value {
    let strip = |item: &Value| {
        let mut item = item.clone();
        if let Some(map) = item.as_object_mut() {
            map.remove("id");
        }
        item
    };
    items.as_array().unwrap().iter().map(strip).collect()
}

/// Checks `calls` (name, parsed arguments) against the weather answer's two calls.
fn check_weather_calls(calls: &[(String, Value)]) {
    let expected = [
        ("get_weather".to_string(), json!({"city": "Paris"})),
        ("search".to_string(), json!({"query": "Paris «météo»"})),
    ];
    assert_eq!(calls, expected, "{calls:?}");
}

#[test]
fn responses_prompts_equal_the_chat_prompts_that_say_the_same() {
    let served = serve(&fixture("qwen3"), says("ok"));
    runtime().block_on(async {
        // A question with tools, instructions as the system message.
        let chat = json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}],
                          "tools": chat_tools(), "max_tokens": 5});
        let responses = json!({"instructions": "Be brief.", "input": QUESTION, "tools": responses_tools(),
                               "max_output_tokens": 5});
        let expected = prompt_of(&served, "/v1/chat/completions", &chat).await;
        assert_eq!(prompt_of(&served, "/v1/responses", &responses).await, expected);

        // A whole round trip: reasoning, the assistant's text and call, the call's output.
        let chat = json!({"messages": [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": "Let me look.", "reasoning_content": "Need the tool.",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "21 °C"},
            {"role": "user", "content": "And in Rome?"},
        ], "tools": chat_tools(), "max_tokens": 5});
        let responses = json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": "What's the weather "},
                                         {"type": "input_text", "text": "in Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Need the tool."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "21 °C"},
            {"type": "message", "role": "user", "content": "And in Rome?"},
        ], "tools": responses_tools(), "max_output_tokens": 5});
        let expected = prompt_of(&served, "/v1/chat/completions", &chat).await;
        let got = prompt_of(&served, "/v1/responses", &responses).await;
        if got != expected {
            let decode = |ids: &[u32]| served.tokenizer.decode(ids).unwrap();
            panic!("responses:\n{}\n!= chat:\n{}", decode(&got), decode(&expected));
        }
        // reasoning.effort "none" turns Qwen3's thinking off, as enable_thinking: false does.
        let chat = json!({"messages": [{"role": "user", "content": QUESTION}],
                          "chat_template_kwargs": {"enable_thinking": false}, "max_tokens": 5});
        let responses = json!({"input": QUESTION, "reasoning": {"effort": "none"}, "max_output_tokens": 5});
        let expected = prompt_of(&served, "/v1/chat/completions", &chat).await;
        assert_eq!(prompt_of(&served, "/v1/responses", &responses).await, expected);
    });
}

#[test]
fn responses_reasoning_and_calls_whole_and_streamed() {
    let served = serve(&fixture("qwen3"), says(QWEN_CALLS));
    let app = served.server.router();
    let body = json!({"input": QUESTION, "tools": responses_tools(), "max_output_tokens": 200});
    runtime().block_on(async {
        let r = ok(&app, "/v1/responses", &body).await;
        assert_eq!(
            (&r["object"], &r["status"], &r["incomplete_details"]),
            (&json!("response"), &json!("completed"), &Value::Null),
            "{r}"
        );
        assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
        let output = r["output"].as_array().unwrap();
        let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "function_call", "function_call"], "{r}");
        assert_eq!(
            output[0]["content"][0],
            json!({"type": "reasoning_text", "text": "The user wants the weather in Paris."})
        );
        let calls: Vec<(String, Value)> = output[1..]
            .iter()
            .map(|c| {
                assert!(
                    c["id"].as_str().unwrap().starts_with("fc_") && c["call_id"].as_str().unwrap().starts_with("call_"),
                    "{c}"
                );
                assert_eq!(c["status"], "completed", "{c}");
                (
                    c["name"].as_str().unwrap().to_string(),
                    serde_json::from_str(c["arguments"].as_str().unwrap()).unwrap(),
                )
            })
            .collect();
        check_weather_calls(&calls);
        let usage = &r["usage"];
        let (input, output_tokens) =
            (usage["input_tokens"].as_u64().unwrap(), usage["output_tokens"].as_u64().unwrap());
        assert_eq!(usage["total_tokens"].as_u64(), Some(input + output_tokens), "{r}");
        assert_eq!(output_tokens as usize, served.tokenizer.encode(QWEN_CALLS, false).unwrap().len(), "{r}");
        let reasoning_tokens = usage["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap();
        assert!(reasoning_tokens > 5 && reasoning_tokens < output_tokens, "{r}");
        assert_eq!(input as usize, served.last_prompt().len());

        let events = stream(&app, "/v1/responses", &body).await;
        for (i, (_, data)) in events.iter().enumerate() {
            assert_eq!(data["sequence_number"], i, "numbered in order: {data}");
        }
        let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
        let deltas = names.iter().filter(|n| **n == "response.reasoning_text.delta").count();
        assert!(deltas > 3, "reasoning streamed in pieces: {names:?}");
        let mut expected = vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ];
        expected.extend(std::iter::repeat_n("response.reasoning_text.delta", deltas));
        expected.extend(["response.reasoning_text.done", "response.content_part.done", "response.output_item.done"]);
        for _ in 0..2 {
            expected.extend([
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]);
        }
        expected.push("response.completed");
        assert_eq!(names, expected);
        let reasoning: String = events
            .iter()
            .filter(|(e, _)| e == "response.reasoning_text.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap())
            .collect();
        assert_eq!(reasoning, "The user wants the weather in Paris.");
        // The final response holds the streamed items, with their ids.
        let done: Vec<&Value> =
            events.iter().filter(|(e, _)| e == "response.output_item.done").map(|(_, d)| &d["item"]).collect();
        let last = &events.last().unwrap().1["response"];
        assert_eq!(last["output"].as_array().unwrap().iter().collect::<Vec<_>>(), done, "{last}");
        assert_eq!(last["status"], "completed");
        assert_eq!(last["usage"]["output_tokens"], r["usage"]["output_tokens"]);
        let streamed_calls: Vec<(String, Value)> = done[1..]
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    serde_json::from_str(c["arguments"].as_str().unwrap()).unwrap(),
                )
            })
            .collect();
        check_weather_calls(&streamed_calls);
    });
}

#[test]
fn responses_text_cut_by_max_output_tokens_is_incomplete() {
    let served = serve(&fixture("qwen3"), says("<think>\nEasy.\n</think>\n\nParis is sunny today, and warm."));
    let app = served.server.router();
    runtime().block_on(async {
        let whole = ok(&app, "/v1/responses", &json!({"input": QUESTION})).await;
        let kinds: Vec<&str> =
            whole["output"].as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "message"], "{whole}");
        assert_eq!(whole["output"][1]["content"][0]["text"], "Paris is sunny today, and warm.", "{whole}");
        assert_eq!(whole["output"][1]["content"][0]["annotations"], json!([]), "{whole}");

        let cut = json!({"input": QUESTION, "max_output_tokens": 12});
        let r = ok(&app, "/v1/responses", &cut).await;
        assert_eq!(
            (&r["status"], &r["incomplete_details"]["reason"]),
            (&json!("incomplete"), &json!("max_output_tokens")),
            "{r}"
        );
        assert_eq!(r["usage"]["output_tokens"], 12, "{r}");
        let events = stream(&app, "/v1/responses", &cut).await;
        let (last, data) = events.last().unwrap();
        assert_eq!(last, "response.incomplete");
        assert_eq!(without_ids(&data["response"]["output"]), without_ids(&r["output"]), "the same items: {data}");
        assert_eq!(r["output"][1]["status"], "incomplete", "{r}");
        let text: String = events
            .iter()
            .filter(|(e, _)| e == "response.output_text.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap())
            .collect();
        let done = events.iter().find(|(e, _)| e == "response.output_text.done").unwrap();
        assert_eq!(done.1["text"], text.as_str());
        assert_eq!(r["output"][1]["content"][0]["text"], text.as_str());
    });
}

#[test]
fn messages_prompts_equal_the_chat_prompts_that_say_the_same() {
    let served = serve(&fixture("qwen3"), says("ok"));
    runtime().block_on(async {
        let chat = json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": "Let me look.", "reasoning_content": "Need the tool.",
             "tool_calls": [{"id": "toolu_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather", "content": "21 °C"},
            {"role": "user", "content": "And in Rome?"},
        ], "tools": chat_tools(), "max_tokens": 5, "chat_template_kwargs": {"enable_thinking": true}});
        let messages = json!({"system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}], "messages": [
            {"role": "user", "content": [{"type": "text", "text": QUESTION}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Need the tool.", "signature": "x"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 °C"}]},
                {"type": "text", "text": "And in Rome?"},
            ]},
        ], "tools": anthropic_tools(), "max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 1024}});
        let expected = prompt_of(&served, "/v1/chat/completions", &chat).await;
        let got = prompt_of(&served, "/v1/messages", &messages).await;
        if got != expected {
            let decode = |ids: &[u32]| served.tokenizer.decode(ids).unwrap();
            panic!("messages:\n{}\n!= chat:\n{}", decode(&got), decode(&expected));
        }
        // count_tokens counts that prompt.
        let counted = ok(&served.server.router(), "/v1/messages/count_tokens", &messages).await;
        assert_eq!(counted, json!({"input_tokens": expected.len()}));

        // tool_choice "tool" names the function: the answer starts inside its call.
        let mut forced = json!({"messages": [{"role": "user", "content": QUESTION}], "tools": anthropic_tools(),
                                "max_tokens": 5, "tool_choice": {"type": "tool", "name": "get_weather"}});
        let prompt = served.tokenizer.decode(&prompt_of(&served, "/v1/messages", &forced).await).unwrap();
        assert!(prompt.ends_with("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "), "{prompt:?}");
        // thinking disabled closes Qwen3's think block in the prompt.
        forced["thinking"] = json!({"type": "disabled"});
        forced.as_object_mut().unwrap().remove("tool_choice");
        let prompt = served.tokenizer.decode(&prompt_of(&served, "/v1/messages", &forced).await).unwrap();
        assert!(prompt.ends_with("<think>\n\n</think>\n\n"), "{prompt:?}");
    });
}

/// A streamed message put together as a client does: its content blocks, stop reason and
/// usage, checking the events' order.
fn assemble_message(events: &[(String, Value)]) -> (Vec<Value>, Value, Value) {
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"], "{names:?}");
    let start = &events[0].1["message"];
    assert_eq!((&start["content"], &start["stop_reason"]), (&json!([]), &Value::Null), "{start}");
    let mut blocks: Vec<Value> = vec![];
    let mut open = None;
    for (name, data) in &events[2..events.len() - 2] {
        let index = data["index"].as_u64().unwrap() as usize;
        match name.as_str() {
            "content_block_start" => {
                assert_eq!((open, index), (None, blocks.len()), "blocks open one at a time, in order: {data}");
                open = Some(index);
                let mut block = data["content_block"].clone();
                if block["type"] == "tool_use" {
                    assert_eq!(block["input"], json!({}), "{data}");
                    block["partial"] = "".into();
                }
                blocks.push(block);
            }
            "content_block_delta" => {
                assert_eq!(open, Some(index), "{data}");
                let (block, delta) = (&mut blocks[index], &data["delta"]);
                let (key, piece) = match delta["type"].as_str().unwrap() {
                    "text_delta" => ("text", &delta["text"]),
                    "thinking_delta" => ("thinking", &delta["thinking"]),
                    "input_json_delta" => ("partial", &delta["partial_json"]),
                    other => panic!("delta {other}"),
                };
                block[key] = (block[key].as_str().unwrap().to_string() + piece.as_str().unwrap()).into();
            }
            "content_block_stop" => {
                assert_eq!(open.take(), Some(index), "{data}");
                let block = &mut blocks[index];
                if block["type"] == "tool_use" {
                    block["input"] = serde_json::from_str(block["partial"].as_str().unwrap()).unwrap();
                    block.as_object_mut().unwrap().remove("partial");
                }
            }
            other => panic!("unexpected event {other}: {data}"),
        }
    }
    assert_eq!(open, None, "every block stopped");
    let delta = &events[events.len() - 2].1;
    (blocks, delta["delta"].clone(), delta["usage"].clone())
}

#[test]
fn messages_thinking_and_tool_use_whole_and_streamed() {
    let served = serve(&fixture("qwen3"), says(QWEN_CALLS));
    let app = served.server.router();
    let body =
        json!({"messages": [{"role": "user", "content": QUESTION}], "tools": anthropic_tools(), "max_tokens": 200});
    runtime().block_on(async {
        let m = ok(&app, "/v1/messages", &body).await;
        assert_eq!(
            (&m["type"], &m["role"], &m["stop_reason"]),
            (&json!("message"), &json!("assistant"), &json!("tool_use")),
            "{m}"
        );
        assert!(m["id"].as_str().unwrap().starts_with("msg_"), "{m}");
        let content = m["content"].as_array().unwrap();
        assert_eq!(
            content[0],
            json!({"type": "thinking", "thinking": "The user wants the weather in Paris.", "signature": ""})
        );
        let calls: Vec<(String, Value)> = content[1..]
            .iter()
            .map(|b| {
                assert_eq!(b["type"], "tool_use", "{b}");
                assert!(b["id"].as_str().unwrap().starts_with("toolu_"), "{b}");
                (b["name"].as_str().unwrap().to_string(), b["input"].clone())
            })
            .collect();
        check_weather_calls(&calls);
        let usage = &m["usage"];
        let prompt = served.last_prompt().len() as u64;
        assert_eq!(
            usage["input_tokens"].as_u64().unwrap() + usage["cache_read_input_tokens"].as_u64().unwrap(),
            prompt,
            "{m}"
        );
        assert_eq!(
            usage["output_tokens"].as_u64().unwrap() as usize,
            served.tokenizer.encode(QWEN_CALLS, false).unwrap().len()
        );

        let (blocks, delta, streamed_usage) = assemble_message(&stream(&app, "/v1/messages", &body).await);
        assert_eq!(without_ids(&Value::Array(blocks)), without_ids(&m["content"]));
        assert_eq!(delta, json!({"stop_reason": "tool_use", "stop_sequence": null}));
        assert_eq!(streamed_usage["output_tokens"], usage["output_tokens"]);
    });

    // Text alone, cut by max_tokens.
    let served = serve(&fixture("qwen3"), says("Paris is sunny today, and warm."));
    let app = served.server.router();
    runtime().block_on(async {
        let body = json!({"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 200});
        let m = ok(&app, "/v1/messages", &body).await;
        assert_eq!(m["content"], json!([{"type": "text", "text": "Paris is sunny today, and warm."}]), "{m}");
        assert_eq!(m["stop_reason"], "end_turn", "{m}");
        let cut = json!({"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 3});
        let m = ok(&app, "/v1/messages", &cut).await;
        assert_eq!((&m["stop_reason"], &m["usage"]["output_tokens"]), (&json!("max_tokens"), &json!(3)), "{m}");
        let (blocks, delta, _) = assemble_message(&stream(&app, "/v1/messages", &cut).await);
        assert_eq!(Value::Array(blocks), m["content"]);
        assert_eq!(delta["stop_reason"], "max_tokens");
    });
}

#[test]
fn bad_input_names_the_field_in_each_protocols_shape() {
    let served = serve(&fixture("qwen3"), says("ok"));
    let app = served.server.router();
    let input = json!([{"role": "user", "content": "hi"}]);
    let responses = |extra: Value| {
        let mut body = json!({"input": input.clone()});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let response_cases = [
        (json!({"input": null}), "input"),
        (json!({"input": 3}), "input"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
        ),
        (json!({"input": [{"role": "tool", "content": "x"}]}), "input[0].role"),
        (
            json!({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}),
            "input[0].arguments",
        ),
        (json!({"input": [{"type": "function_call_output", "output": "x"}]}), "input[0].call_id"),
        (json!({"input": [{"type": "item_reference", "id": "msg_1"}]}), "input[0].type"),
        (json!({"input": [{"type": "computer_call"}]}), "input[0].type"),
        (responses(json!({"tools": [{"type": "web_search"}]})), "tools[0].type"),
        (responses(json!({"tools": [{"type": "function", "parameters": {}}]})), "tools[0].name"),
        (responses(json!({"tool_choice": {"type": "file_search"}})), "tool_choice"),
        (
            responses(
                json!({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"uniqueItems": true}}}}),
            ),
            "text.format.schema",
        ),
        (responses(json!({"text": {"format": {"type": "yaml"}}})), "text.format.type"),
        (responses(json!({"previous_response_id": "resp_1"})), "previous_response_id"),
        (responses(json!({"max_output_tokens": 0})), "max_output_tokens"),
        (responses(json!({"max_output_tokens": "many"})), "max_output_tokens"),
        (responses(json!({"temperature": -1})), "temperature"),
    ];
    let messages = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let message_cases = [
        (json!({"messages": [{"role": "user", "content": "hi"}]}), "max_tokens", StatusCode::BAD_REQUEST),
        (
            messages(json!({"messages": [{"role": "system", "content": "x"}]})),
            "messages[0].role",
            StatusCode::BAD_REQUEST,
        ),
        (
            messages(json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})),
            "messages[0].content[0].type",
            StatusCode::BAD_REQUEST,
        ),
        (
            messages(
                json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}),
            ),
            "messages[0].content[0].type",
            StatusCode::BAD_REQUEST,
        ),
        (
            messages(json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The"}]})),
            "messages[1].role",
            StatusCode::BAD_REQUEST,
        ),
        (
            messages(json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})),
            "tools[0].type",
            StatusCode::BAD_REQUEST,
        ),
        (messages(json!({"tool_choice": {"type": "tool"}})), "tool_choice.name", StatusCode::BAD_REQUEST),
        (messages(json!({"stop_sequences": "."})), "stop_sequences", StatusCode::BAD_REQUEST),
        (messages(json!({"thinking": {"type": "sometimes"}})), "thinking.type", StatusCode::BAD_REQUEST),
        (messages(json!({"top_p": 2})), "top_p", StatusCode::BAD_REQUEST),
        (
            messages(json!({"output_config": {"format": {"type": "json_schema", "schema": {}}}})),
            "output_config.format",
            StatusCode::BAD_REQUEST,
        ),
        (messages(json!({"max_tokens": 0})), "max_tokens", StatusCode::BAD_REQUEST),
        (messages(json!({"model": "claude-sonnet-4-5"})), "model", StatusCode::NOT_FOUND),
    ];
    runtime().block_on(async {
        for (body, param) in response_cases {
            let (status, text) = post(&app, "/v1/responses", &body, &[]).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {text}");
            let error: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(error["error"]["param"], param, "{body}: {text}");
            assert!(error["error"]["message"].as_str().unwrap().contains(param.split('[').next().unwrap()), "{text}");
        }
        for (body, field, status_expected) in message_cases {
            let (status, text) = post(&app, "/v1/messages", &body, &[]).await;
            assert_eq!(status, status_expected, "{body}: {text}");
            let error: Value = serde_json::from_str(&text).unwrap();
            let kind = if status == StatusCode::NOT_FOUND { "not_found_error" } else { "invalid_request_error" };
            assert_eq!((&error["type"], &error["error"]["type"]), (&json!("error"), &json!(kind)), "{text}");
            let message = error["error"]["message"].as_str().unwrap();
            assert!(message.contains(field) || (field == "model" && message.contains("model")), "{body}: {text}");
        }
        // Not JSON: still Anthropic's shape on its route.
        let request = axum::http::Request::builder()
            .method("POST")
            .uri("/v1/messages")
            .header("content-type", "application/json")
            .body(axum::body::Body::from("{\"messages\": ["))
            .unwrap();
        let response = tower::ServiceExt::oneshot(app.clone(), request).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let error: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        // A route or method the Messages API does not have: Anthropic's shape too, not OpenAI's.
        for (method, uri, status, kind) in [
            ("GET", "/v1/messages", StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error"),
            ("POST", "/v1/messages/batches", StatusCode::NOT_FOUND, "not_found_error"),
            ("GET", "/v1/messages/count_tokens", StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error"),
        ] {
            let request =
                axum::http::Request::builder().method(method).uri(uri).body(axum::body::Body::empty()).unwrap();
            let response = tower::ServiceExt::oneshot(app.clone(), request).await.unwrap();
            assert_eq!(response.status(), status, "{method} {uri}");
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            let error: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!((&error["type"], &error["error"]["type"]), (&json!("error"), &json!(kind)), "{error}");
            assert!(error["error"]["message"].as_str().unwrap().contains(uri), "{error}");
        }
        // Elsewhere OpenAI's.
        let request = axum::http::Request::builder().uri("/v1/messagesx").body(axum::body::Body::empty()).unwrap();
        let response = tower::ServiceExt::oneshot(app.clone(), request).await.unwrap();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let error: Value = serde_json::from_slice(&bytes).unwrap();
        assert!(error["error"]["code"].is_string() && error.get("type").is_none(), "{error}");
    });
}

#[test]
fn messages_take_the_key_as_x_api_key() {
    let served = serve_keyed(&fixture("qwen3"), says("ok"), Some("sk-test"));
    let app = served.server.router();
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
    runtime().block_on(async {
        for headers in [[("x-api-key", "sk-test")], [("authorization", "Bearer sk-test")]] {
            let (status, text) = post(&app, "/v1/messages", &body, &headers).await;
            assert_eq!(status, StatusCode::OK, "{headers:?}: {text}");
        }
        for headers in [&[("x-api-key", "sk-wrong")][..], &[]] {
            let (status, text) = post(&app, "/v1/messages", &body, headers).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
            let error: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(error["error"]["type"], "authentication_error", "{text}");
        }
        // The OpenAI routes take the key as OpenAI's clients send it.
        let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
        let (status, _) = post(&app, "/v1/chat/completions", &chat, &[("x-api-key", "sk-test")]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _) =
            post(&app, "/v1/responses", &json!({"input": "hi"}), &[("authorization", "Bearer sk-test")]).await;
        assert_eq!(status, StatusCode::OK);
    });
}
