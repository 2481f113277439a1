//! The server's routes over engine cores that misbehave on purpose (a request that fails, a
//! step that fails, a step that panics), over a core that answers every request the same
//! way, to check each field's validation and the metrics without running a model, and over a
//! core held still, to fill the queue. The real model over real sockets is tested in
//! crates/nuvec-cli/tests/serve.rs and serve_load.rs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use nuvec_lm::{BatcherStats, Event, FinishReason, GenerateOptions, RequestId, Tokenizer};
use nuvec_server::{EngineCore, ModelInfo, Server, ServerConfig};
use serde_json::{json, Value};
use tower::ServiceExt;

fn tokenizer() -> Tokenizer {
    static TOKENIZER: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let gguf = std::env::var("NUVEC_DEFAULT_GGUF")
                .unwrap_or_else(|_| panic!("NUVEC_DEFAULT_GGUF is not set: run scripts/test.sh"));
            nuvec_lm::load(&gguf).unwrap().1
        })
        .clone()
}

/// How a [`Scripted`] core behaves.
#[derive(Clone, Copy, PartialEq)]
enum Script {
    /// Every request gets `max_tokens` tokens (ids 100, 101, ...), then `Length`.
    Answer,
    /// As `Answer`, but a request with `max_tokens == 13` fails at its first step.
    FailThirteen,
    /// The first step fails as a whole.
    StepError,
    /// The first step panics.
    StepPanic,
}

/// A request in a [`Scripted`] core.
struct ScriptedRequest {
    id: RequestId,
    prompt_len: usize,
    started: bool,
    left: usize,
    fails: bool,
    /// Ends with `EndOfSequence` (max_tokens == 7) rather than `Length`.
    stops: bool,
}

struct Scripted {
    script: Script,
    next: u64,
    live: Vec<ScriptedRequest>,
    generated: u64,
    /// While this is false the core steps without admitting anyone (every request waits).
    gate: Option<Arc<AtomicBool>>,
}

/// The prompt tokens a [`Scripted`] core says came from the prefix cache.
fn scripted_cached(prompt_len: usize) -> usize {
    prompt_len / 2
}

impl EngineCore for Scripted {
    fn submit(&mut self, prompt: Vec<u32>, options: GenerateOptions) -> nuvec_lm::Result<RequestId> {
        if prompt.is_empty() {
            return Err(nuvec_lm::Error::Invalid("the prompt is empty".into()));
        }
        let id = RequestId(self.next);
        self.next += 1;
        let fails = self.script == Script::FailThirteen && options.max_tokens == 13;
        self.live.push(ScriptedRequest {
            id,
            prompt_len: prompt.len(),
            started: false,
            left: options.max_tokens,
            fails,
            stops: options.max_tokens == 7,
        });
        Ok(id)
    }

    fn step(&mut self) -> nuvec_lm::Result<Vec<Event>> {
        match self.script {
            Script::StepError => return Err(nuvec_lm::Error::Invalid("the device was lost (scripted)".into())),
            Script::StepPanic => panic!("a scripted panic inside the step"),
            _ => {}
        }
        if self.gate.as_ref().is_some_and(|g| !g.load(Ordering::Acquire)) {
            std::thread::sleep(Duration::from_millis(2));
            return Ok(vec![]);
        }
        let mut events = vec![];
        for r in &mut self.live {
            let id = r.id;
            if !r.started {
                r.started = true;
                events.push(Event::Started { id, cached_tokens: scripted_cached(r.prompt_len) });
            }
            if r.fails {
                events.push(Event::Failed { id, error: nuvec_lm::Error::Invalid("scripted failure".into()) });
                events.push(Event::Finished { id, reason: FinishReason::Error });
                r.left = 0;
                continue;
            }
            events.push(Event::Token { id, token: 100 + self.generated as u32 % 50 });
            self.generated += 1;
            r.left -= 1;
            if r.left == 0 {
                let reason = if r.stops { FinishReason::EndOfSequence } else { FinishReason::Length };
                events.push(Event::Finished { id, reason });
            }
        }
        self.live.retain(|r| r.left > 0);
        Ok(events)
    }

    fn is_busy(&self) -> bool {
        !self.live.is_empty()
    }

    fn cancel(&mut self, _id: RequestId) -> bool {
        false
    }

    fn stats(&self) -> BatcherStats {
        let started = self.live.iter().filter(|r| r.started).count();
        BatcherStats {
            running: started,
            waiting: self.live.len() - started,
            blocks_used: started,
            blocks_total: 100,
            preemptions: 7,
            generated_tokens: self.generated,
            ..Default::default()
        }
    }
}

fn server(script: Script, api_key: Option<&str>) -> Server {
    server_with(script, api_key, 256, None)
}

fn server_with(script: Script, api_key: Option<&str>, max_queue: usize, gate: Option<Arc<AtomicBool>>) -> Server {
    let tokenizer = tokenizer();
    let mut config = ServerConfig::new("scripted-model", &tokenizer);
    config.api_key = api_key.map(str::to_string);
    config.body_limit = 4096;
    config.defaults.max_tokens = 5;
    config.max_queue = max_queue;
    let info = ModelInfo { vocab_size: 49152, context_length: Some(64), adapters: vec![] };
    Server::with_engine(tokenizer, info, config, move |engine| {
        engine.run(Scripted { script, next: 0, live: vec![], generated: 0, gate });
        Ok(())
    })
    .unwrap()
}

struct Reply {
    status: StatusCode,
    request_id: Option<String>,
    retry_after: Option<String>,
    text: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }

    /// The error object's `param`, checking the error's shape on the way.
    fn param(&self) -> Option<String> {
        let body = self.json();
        let error = &body["error"];
        assert!(error["message"].is_string(), "{}", self.text);
        assert!(error["type"].is_string(), "{}", self.text);
        assert!(error.get("param").is_some() && error.get("code").is_some(), "{}", self.text);
        error["param"].as_str().map(str::to_string)
    }
}

async fn call(app: &axum::Router, method: &str, path: &str, body: &str, key: Option<&str>) -> Reply {
    let mut request = Request::builder().method(method).uri(path).header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let response = app.clone().oneshot(request.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let status = response.status();
    let headers = response.headers();
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_string());
    let (request_id, retry_after) = (header("x-request-id"), header("retry-after"));
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    Reply { status, request_id, retry_after, text: String::from_utf8(bytes.to_vec()).unwrap() }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn every_field_is_checked_naming_it() {
    let server = server(Script::Answer, None);
    let app = server.router();
    runtime().block_on(async {
        let chat = |extra: Value| {
            let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            body.to_string()
        };
        let ok = call(&app, "POST", "/v1/chat/completions", &chat(json!({})), None).await;
        assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
        assert_eq!(ok.json()["usage"]["completion_tokens"], 5, "{}", ok.text);
        // Unknown fields are ignored; null is absent; the served id and no id are both taken.
        for extra in [
            json!({"user": "x", "some_future_field": {"a": 1}}),
            json!({"temperature": null, "stop": null}),
            json!({"model": "scripted-model"}),
            json!({"n": 1, "tools": [], "tool_choice": "none", "response_format": {"type": "text"}}),
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}),
            json!({"messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]}),
            json!({"max_completion_tokens": 2, "seed": -5, "top_k": -1, "logit_bias": {"12": 5}}),
        ] {
            let r = call(&app, "POST", "/v1/chat/completions", &chat(extra.clone()), None).await;
            assert_eq!(r.status, StatusCode::OK, "{extra}: {}", r.text);
        }
        let cases: &[(Value, StatusCode, &str)] = &[
            (json!({"temperature": -1}), StatusCode::BAD_REQUEST, "temperature"),
            (json!({"temperature": "warm"}), StatusCode::BAD_REQUEST, "temperature"),
            (json!({"top_p": 1.5}), StatusCode::BAD_REQUEST, "top_p"),
            (json!({"min_p": -0.1}), StatusCode::BAD_REQUEST, "min_p"),
            (json!({"top_k": 1.5}), StatusCode::BAD_REQUEST, "top_k"),
            (json!({"top_k": 49152}), StatusCode::BAD_REQUEST, "top_k"),
            (json!({"max_tokens": "ten"}), StatusCode::BAD_REQUEST, "max_tokens"),
            (json!({"max_tokens": 0}), StatusCode::BAD_REQUEST, "max_tokens"),
            (json!({"max_completion_tokens": -3}), StatusCode::BAD_REQUEST, "max_completion_tokens"),
            (json!({"seed": "7"}), StatusCode::BAD_REQUEST, "seed"),
            (json!({"stop": 5}), StatusCode::BAD_REQUEST, "stop"),
            (json!({"stop": ["a", 5]}), StatusCode::BAD_REQUEST, "stop[1]"),
            (json!({"stop": [""]}), StatusCode::BAD_REQUEST, "stop"),
            (json!({"stream": "yes"}), StatusCode::BAD_REQUEST, "stream"),
            (json!({"stream_options": {"include_usage": 1}}), StatusCode::BAD_REQUEST, "stream_options.include_usage"),
            (json!({"presence_penalty": 3}), StatusCode::BAD_REQUEST, "presence_penalty"),
            (json!({"frequency_penalty": "x"}), StatusCode::BAD_REQUEST, "frequency_penalty"),
            (json!({"repetition_penalty": 0}), StatusCode::BAD_REQUEST, "repetition_penalty"),
            (json!({"logit_bias": {"x": 1}}), StatusCode::BAD_REQUEST, "logit_bias"),
            (json!({"logit_bias": {"49152": 1}}), StatusCode::BAD_REQUEST, "logit_bias"),
            (json!({"logit_bias": {"5": 101}}), StatusCode::BAD_REQUEST, "logit_bias"),
            (json!({"logit_bias": [1]}), StatusCode::BAD_REQUEST, "logit_bias"),
            (json!({"logprobs": 1}), StatusCode::BAD_REQUEST, "logprobs"),
            (json!({"logprobs": true, "top_logprobs": 21}), StatusCode::BAD_REQUEST, "top_logprobs"),
            (json!({"top_logprobs": 2}), StatusCode::BAD_REQUEST, "top_logprobs"),
            (json!({"n": 0}), StatusCode::BAD_REQUEST, "n"),
            (json!({"n": 17}), StatusCode::BAD_REQUEST, "n"),
            (json!({"n": -1}), StatusCode::BAD_REQUEST, "n"),
            (json!({"n": 1.5}), StatusCode::BAD_REQUEST, "n"),
            (json!({"n": "1"}), StatusCode::BAD_REQUEST, "n"),
            (json!({"tools": [{"type": "function"}]}), StatusCode::BAD_REQUEST, "tools[0].function"),
            // SmolLM2's template writes no tool calls.
            (json!({"tools": [{"type": "function", "function": {"name": "f"}}]}), StatusCode::BAD_REQUEST, "tools"),
            (json!({"tool_choice": "required"}), StatusCode::BAD_REQUEST, "tool_choice"),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"uniqueItems": true}}}}),
                StatusCode::BAD_REQUEST,
                "response_format.json_schema.schema",
            ),
            (json!({"response_format": {"type": "xml"}}), StatusCode::BAD_REQUEST, "response_format.type"),
            (json!({"min_tokens": 9}), StatusCode::BAD_REQUEST, "min_tokens"),
            (json!({"model": "gpt-4o"}), StatusCode::NOT_FOUND, "model"),
            (json!({"model": 4}), StatusCode::BAD_REQUEST, "model"),
            (json!({"messages": []}), StatusCode::BAD_REQUEST, "messages"),
            (json!({"messages": "hi"}), StatusCode::BAD_REQUEST, "messages"),
            (json!({"messages": [{"content": "hi"}]}), StatusCode::BAD_REQUEST, "messages[0].role"),
            (json!({"messages": [{"role": "robot", "content": "hi"}]}), StatusCode::BAD_REQUEST, "messages[0].role"),
            (json!({"messages": [{"role": "function", "content": "hi"}]}), StatusCode::BAD_REQUEST, "messages[0].role"),
            (json!({"messages": [{"role": "user", "content": 7}]}), StatusCode::BAD_REQUEST, "messages[0].content"),
            (json!({"messages": [{"role": "user"}]}), StatusCode::BAD_REQUEST, "messages[0].content"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
                StatusCode::BAD_REQUEST,
                "messages[0].content[0].type",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x ".repeat(100)}]}),
                StatusCode::BAD_REQUEST,
                "messages",
            ),
        ];
        for (extra, status, param) in cases {
            let r = call(&app, "POST", "/v1/chat/completions", &chat(extra.clone()), None).await;
            assert_eq!(r.status, *status, "{extra}: {}", r.text);
            assert_eq!(r.param().as_deref(), Some(*param), "{extra}: {}", r.text);
        }
        let long = call(&app, "POST", "/v1/chat/completions", &chat(json!({"messages": [{"role": "user", "content": "x ".repeat(100)}]})), None).await;
        assert_eq!(long.json()["error"]["code"], "context_length_exceeded", "{}", long.text);

        let completion_cases: &[(Value, &str)] = &[
            (json!({}), "prompt"),
            (json!({"prompt": 5}), "prompt"),
            (json!({"prompt": []}), "prompt"),
            (json!({"prompt": ["a", "b"]}), "prompt"),
            (json!({"prompt": [1, "b"]}), "prompt[1]"),
            (json!({"prompt": [1, 49152]}), "prompt"),
            (json!({"prompt": [1, -2]}), "prompt"),
            (json!({"prompt": "hi", "echo": true}), "echo"),
            (json!({"prompt": "hi", "best_of": 3}), "best_of"),
            (json!({"prompt": "hi", "suffix": "end"}), "suffix"),
            (json!({"prompt": "hi", "logprobs": 21}), "logprobs"),
            (json!({"prompt": "hi", "logprobs": "2"}), "logprobs"),
            (json!({"prompt": (0..64).collect::<Vec<u32>>()}), "prompt"),
        ];
        for (body, param) in completion_cases {
            let r = call(&app, "POST", "/v1/completions", &body.to_string(), None).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text);
            assert_eq!(r.param().as_deref(), Some(*param), "{body}: {}", r.text);
        }
        for body in [json!({"prompt": "hi"}), json!({"prompt": [1, 2, 3]}), json!({"prompt": [[1, 2]]}), json!({"prompt": ["hi"]})] {
            let r = call(&app, "POST", "/v1/completions", &body.to_string(), None).await;
            assert_eq!(r.status, StatusCode::OK, "{body}: {}", r.text);
            assert_eq!(r.json()["object"], "text_completion");
        }

        for (body, status) in [
            ("{not json", StatusCode::BAD_REQUEST),
            ("[1, 2]", StatusCode::BAD_REQUEST),
            ("", StatusCode::BAD_REQUEST),
        ] {
            let r = call(&app, "POST", "/v1/chat/completions", body, None).await;
            assert_eq!(r.status, status, "{body}: {}", r.text);
            assert_eq!(r.param(), None);
        }
        let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(5000));
        let r = call(&app, "POST", "/v1/completions", &big, None).await;
        assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text);
        assert_eq!(r.json()["error"]["code"], "request_too_large");
        let r = call(&app, "GET", "/v1/nothing-here", "", None).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
        assert_eq!(r.param(), None);
        let r = call(&app, "GET", "/v1/chat/completions", "", None).await;
        assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{}", r.text);
        let r = call(&app, "GET", "/v1/models", "", None).await;
        assert_eq!(r.json()["data"][0]["id"], "scripted-model", "{}", r.text);
        let r = call(&app, "GET", "/v1/models/scripted-model", "", None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let r = call(&app, "GET", "/v1/models/other", "", None).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    });
}

#[test]
fn the_api_key_guards_v1_only() {
    let server = server(Script::Answer, Some("sesame"));
    let app = server.router();
    runtime().block_on(async {
        let body = json!({"prompt": "hi"}).to_string();
        for key in [None, Some("open"), Some("sesame2"), Some("")] {
            let r = call(&app, "POST", "/v1/completions", &body, key).await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{key:?}: {}", r.text);
            assert_eq!(r.json()["error"]["code"], "invalid_api_key");
            let r = call(&app, "GET", "/v1/models", "", key).await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{key:?}: {}", r.text);
        }
        let r = call(&app, "POST", "/v1/completions", &body, Some("sesame")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let r = call(&app, "GET", "/health", "", None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        for path in ["/tokenize", "/detokenize"] {
            let r = call(&app, "POST", path, &json!({"prompt": "hi", "tokens": [1]}).to_string(), None).await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}: {}", r.text);
        }
        let r = call(&app, "POST", "/tokenize", &json!({"prompt": "hi"}).to_string(), Some("sesame")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let r = call(&app, "GET", "/metrics", "", None).await;
        assert_eq!(r.status, StatusCode::OK, "/metrics is open to monitors: {}", r.text);
    });
}

#[test]
fn a_failed_request_fails_alone_with_its_id() {
    let server = server(Script::FailThirteen, None);
    let app = server.router();
    runtime().block_on(async {
        let good = json!({"prompt": "hi", "max_tokens": 40}).to_string();
        let bad = json!({"prompt": "hi", "max_tokens": 13}).to_string();
        let (a, b, c) = tokio::join!(
            call(&app, "POST", "/v1/completions", &good, None),
            call(&app, "POST", "/v1/completions", &bad, None),
            call(&app, "POST", "/v1/completions", &good, None),
        );
        for r in [&a, &c] {
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            assert_eq!(r.json()["usage"]["completion_tokens"], 40, "{}", r.text);
        }
        assert_eq!(b.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", b.text);
        let message = b.json()["error"]["message"].as_str().unwrap().to_string();
        let id = b.request_id.clone().unwrap();
        assert!(id.starts_with("cmpl-") && message.contains(&id), "{id}: {message}");
        assert!(message.contains("scripted failure"), "{message}");
        // Streaming: the failure is an error event, then [DONE].
        let stream = json!({"prompt": "hi", "max_tokens": 13, "stream": true}).to_string();
        let r = call(&app, "POST", "/v1/completions", &stream, None).await;
        assert_eq!(r.status, StatusCode::OK);
        let events: Vec<&str> = r.text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
        assert_eq!(events.len(), 2, "{}", r.text);
        let error: Value = serde_json::from_str(events[0]).unwrap();
        assert_eq!(error["error"]["type"], "server_error", "{}", r.text);
        assert_eq!(events[1], "[DONE]");
        let r = call(&app, "GET", "/health", "", None).await;
        assert_eq!(r.status, StatusCode::OK, "a failed request leaves the server healthy: {}", r.text);
        assert_eq!(r.json()["requests"]["failed"], 2, "{}", r.text);
    });
}

fn engine_failure_makes_health_503(script: Script, words: &str) {
    let server = server(script, None);
    let app = server.router();
    runtime().block_on(async {
        let r = call(&app, "GET", "/health", "", None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let body = json!({"messages": [{"role": "user", "content": "hi"}]}).to_string();
        let r = call(&app, "POST", "/v1/chat/completions", &body, None).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text);
        assert!(r.text.contains(words), "{}", r.text);
        let r = call(&app, "GET", "/health", "", None).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
        assert!(r.json()["error"].as_str().unwrap().contains(words), "{}", r.text);
        let r = call(&app, "POST", "/v1/chat/completions", &body, None).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
        assert!(r.text.contains(words), "{}", r.text);
    });
}

#[test]
fn an_engine_error_makes_health_503() {
    engine_failure_makes_health_503(Script::StepError, "device was lost");
}

#[test]
fn an_engine_panic_makes_health_503() {
    engine_failure_makes_health_503(Script::StepPanic, "scripted panic");
}

#[test]
fn an_engine_that_cannot_start_is_an_error() {
    let tokenizer = tokenizer();
    let config = ServerConfig::new("m", &tokenizer);
    let info = ModelInfo { vocab_size: 10, context_length: None, adapters: vec![] };
    let started = Server::with_engine(tokenizer, info, config, |_engine| {
        Err(nuvec_lm::Error::Invalid("no memory left for one cache block".into()))
    });
    let error = started.err().expect("it must not start");
    assert!(error.to_string().contains("no memory left"), "{error}");
}

/// `/metrics` as series → value (`name{labels}` as written).
async fn scrape(app: &axum::Router) -> std::collections::HashMap<String, f64> {
    let r = call(app, "GET", "/metrics", "", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("{l}"));
            (series.to_string(), value.parse().unwrap_or_else(|e| panic!("{l}: {e}")))
        })
        .collect()
}

fn series(name: &str, extra: &str) -> String {
    match extra {
        "" => format!("{name}{{model_name=\"scripted-model\"}}"),
        _ => format!("{name}{{model_name=\"scripted-model\",{extra}}}"),
    }
}

/// `/tokenize`'s count for `body`.
async fn token_count(app: &axum::Router, body: Value) -> u64 {
    let r = call(app, "POST", "/tokenize", &body.to_string(), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json()["count"].as_u64().unwrap()
}

#[test]
fn metrics_count_exactly_what_was_served() {
    let server = server(Script::FailThirteen, None);
    let app = server.router();
    runtime().block_on(async {
        // Warm: counters already moved before the window under test.
        let r = call(&app, "POST", "/v1/completions", &json!({"prompt": "warm up"}).to_string(), None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let before = scrape(&app).await;

        let chat = |content: &str, extra: Value| {
            let mut body = json!({"messages": [{"role": "user", "content": content}]});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            body
        };
        let ok: Vec<(&str, Value)> = vec![
            ("/v1/chat/completions", chat("What is the capital of France?", json!({}))),
            ("/v1/chat/completions", chat("Name three colors.", json!({"max_tokens": 7}))),
            ("/v1/chat/completions", chat("Count to ten.", json!({"max_tokens": 9, "stream": true, "stream_options": {"include_usage": true}}))),
            ("/v1/completions", json!({"prompt": [5, 6, 7, 8, 9, 10, 11], "max_tokens": 4})),
            ("/v1/completions", json!({"prompt": "Once upon a time", "max_tokens": 7, "stream": true, "stream_options": {"include_usage": true}})),
            ("/v1/completions", json!({"prompt": "x", "max_tokens": 1})),
        ];
        let (mut prompt, mut cached, mut generated, mut itl, mut stop, mut length) = (0, 0, 0, 0, 0, 0);
        for (path, body) in &ok {
            let r = call(&app, "POST", path, &body.to_string(), None).await;
            assert_eq!(r.status, StatusCode::OK, "{body}: {}", r.text);
            let usage = if body["stream"] == true {
                let data: Vec<&str> = r.text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
                serde_json::from_str::<Value>(data[data.len() - 2]).unwrap()["usage"].clone()
            } else {
                r.json()["usage"].clone()
            };
            let (p, c) = (usage["prompt_tokens"].as_u64().unwrap(), usage["completion_tokens"].as_u64().unwrap());
            assert_eq!(usage["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(scripted_cached(p as usize) as u64));
            prompt += p;
            cached += scripted_cached(p as usize) as u64;
            generated += c;
            itl += c - 1;
            match body["max_tokens"].as_u64() {
                Some(7) => stop += 1,
                _ => length += 1,
            }
        }
        // One that fails at its first step: its prompt was taken, no token came.
        let failing = json!({"prompt": "this one fails", "max_tokens": 13});
        let r = call(&app, "POST", "/v1/completions", &failing.to_string(), None).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text);
        let failed_prompt = token_count(&app, json!({"prompt": "this one fails"})).await;
        prompt += failed_prompt;
        cached += scripted_cached(failed_prompt as usize) as u64;
        // Malformed ones reach no counter.
        for bad in ["{oops", "{\"prompt\": 5}"] {
            let r = call(&app, "POST", "/v1/completions", bad, None).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
        }

        // The gauges are published after the step that finished the last request.
        let start = Instant::now();
        let mut after = scrape(&app).await;
        while after[&series("nuvec:num_requests_running", "")] != 0.0 {
            assert!(start.elapsed() < Duration::from_secs(10), "{after:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
            after = scrape(&app).await;
        }
        let moved = |name: &str, extra: &str| {
            let key = series(name, extra);
            let (a, b) = (after.get(&key), before.get(&key));
            assert!(a.is_some() && b.is_some(), "{key} is missing: {after:?}");
            a.unwrap() - b.unwrap()
        };
        let requests = ok.len() as f64 + 1.0;
        assert_eq!(moved("nuvec:prompt_tokens_total", ""), prompt as f64);
        assert_eq!(moved("nuvec:prefix_cache_queries_total", ""), prompt as f64);
        assert_eq!(moved("nuvec:prefix_cache_hits_total", ""), cached as f64);
        assert_eq!(moved("nuvec:generation_tokens_total", ""), generated as f64);
        assert_eq!(moved("nuvec:request_success_total", "finished_reason=\"stop\""), stop as f64);
        assert_eq!(moved("nuvec:request_success_total", "finished_reason=\"length\""), length as f64);
        assert_eq!(moved("nuvec:request_success_total", "finished_reason=\"error\""), 1.0);
        assert_eq!(moved("nuvec:request_success_total", "finished_reason=\"abort\""), 0.0);
        // Every request that got a token has one time to first token; every later token one gap.
        assert_eq!(moved("nuvec:time_to_first_token_seconds_count", ""), ok.len() as f64);
        assert_eq!(moved("nuvec:time_to_first_token_seconds_bucket", "le=\"+Inf\""), ok.len() as f64);
        assert_eq!(moved("nuvec:inter_token_latency_seconds_count", ""), itl as f64);
        assert_eq!(moved("nuvec:e2e_request_latency_seconds_count", ""), requests);
        assert!(moved("nuvec:time_to_first_token_seconds_sum", "") > 0.0);
        // No bucket holds more than all; the last holds all.
        let itl_count = after[&series("nuvec:inter_token_latency_seconds_count", "")];
        let buckets: Vec<f64> = (after.iter())
            .filter(|(k, _)| k.starts_with("nuvec:inter_token_latency_seconds_bucket"))
            .map(|(_, v)| *v)
            .collect();
        assert!(buckets.iter().all(|&v| v <= itl_count), "{buckets:?}");
        assert_eq!(after[&series("nuvec:inter_token_latency_seconds_bucket", "le=\"+Inf\"")], itl_count);
        // The gauges are the core's.
        assert_eq!(after[&series("nuvec:num_requests_waiting", "")], 0.0);
        assert_eq!(after[&series("nuvec:kv_cache_blocks_total", "")], 100.0);
        assert_eq!(after[&series("nuvec:kv_cache_blocks_used", "")], 0.0);
        assert_eq!(after[&series("nuvec:num_preemptions_total", "")], 7.0);
        assert_eq!(after[&series("nuvec:requests_rejected_total", "")], 0.0);
    });
}

#[test]
fn a_full_queue_answers_429_and_drains() {
    let gate = Arc::new(AtomicBool::new(false));
    let server = server_with(Script::Answer, None, 3, Some(gate.clone()));
    let app = server.router();
    runtime().block_on(async {
        let body = json!({"prompt": "hi", "max_tokens": 4}).to_string();
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let (app, body) = (app.clone(), body.clone());
                tokio::spawn(async move { call(&app, "POST", "/v1/completions", &body, None).await })
            })
            .collect();
        // The held core has taken all three; none is admitted.
        let start = Instant::now();
        loop {
            let h = call(&app, "GET", "/health", "", None).await.json();
            if h["requests"]["waiting"] == 3 {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "the requests never queued: {h}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for path in ["/v1/completions", "/v1/chat/completions"] {
            let body = match path {
                "/v1/completions" => body.clone(),
                _ => json!({"messages": [{"role": "user", "content": "hi"}]}).to_string(),
            };
            let r = call(&app, "POST", path, &body, None).await;
            assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
            assert_eq!(r.json()["error"]["type"], "rate_limit_exceeded", "{}", r.text);
            assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded", "{}", r.text);
            assert!(r.json()["error"]["message"].as_str().unwrap().contains("3 requests"), "{}", r.text);
            assert_eq!(r.retry_after.as_deref(), Some("1"));
            assert!(r.request_id.is_some());
        }
        // A bad request still hears what is wrong with it.
        let r = call(&app, "POST", "/v1/completions", &json!({"prompt": "hi", "top_p": 2}).to_string(), None).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
        let m = scrape(&app).await;
        assert_eq!(m[&series("nuvec:requests_rejected_total", "")], 2.0, "{m:?}");
        assert_eq!(m[&series("nuvec:num_requests_waiting", "")], 3.0, "{m:?}");

        gate.store(true, Ordering::Release);
        for w in waiting {
            let r = w.await.unwrap();
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            assert_eq!(r.json()["usage"]["completion_tokens"], 4, "{}", r.text);
        }
        // The queue drained: three more fit at once again.
        let path = "/v1/completions";
        let again = tokio::join!(
            call(&app, "POST", path, &body, None),
            call(&app, "POST", path, &body, None),
            call(&app, "POST", path, &body, None)
        );
        for r in [again.0, again.1, again.2] {
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        }
    });
}

#[test]
fn tokenize_and_detokenize_as_vllm() {
    let server = server(Script::Answer, None);
    let app = server.router();
    let tok = tokenizer();
    runtime().block_on(async {
        let text = "The capital of France is Paris.";
        let r = call(&app, "POST", "/tokenize", &json!({"prompt": text}).to_string(), None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let body = r.json();
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(body["tokens"], json!(ids), "{}", r.text);
        assert_eq!(body["count"], ids.len(), "{}", r.text);
        assert_eq!(body["max_model_len"], 64, "{}", r.text);
        assert_eq!(body["token_strs"], Value::Null, "{}", r.text);
        let plain = json!({"prompt": text, "add_special_tokens": false, "return_token_strs": true});
        let r = call(&app, "POST", "/tokenize", &plain.to_string(), None).await;
        let body = r.json();
        let plain_ids = tok.encode(text, false).unwrap();
        assert_eq!(body["tokens"], json!(plain_ids), "{}", r.text);
        let strs: String = body["token_strs"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
        assert_eq!(strs, text, "{}", r.text);

        // Round trip.
        let r = call(&app, "POST", "/detokenize", &json!({"tokens": plain_ids}).to_string(), None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(r.json()["prompt"], text, "{}", r.text);
        let r = call(&app, "POST", "/detokenize", &json!({"tokens": [], "model": "scripted-model"}).to_string(), None)
            .await;
        assert_eq!(r.json()["prompt"], "", "{}", r.text);

        // Messages: exactly the ids a chat completion is given.
        let messages = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]);
        let r = call(&app, "POST", "/tokenize", &json!({"messages": messages}).to_string(), None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let count = r.json()["count"].as_u64().unwrap();
        let rendered = tok
            .chat_template()
            .unwrap()
            .render_values(&messages, true, false, &tok.template_context(Default::default()))
            .unwrap();
        assert_eq!(r.json()["tokens"], json!(tok.encode(&rendered, false).unwrap()), "{}", r.text);
        let chat = call(&app, "POST", "/v1/chat/completions", &json!({"messages": messages}).to_string(), None).await;
        assert_eq!(chat.json()["usage"]["prompt_tokens"].as_u64(), Some(count), "{}", chat.text);
        let open = json!({"messages": messages, "add_generation_prompt": false});
        assert!(token_count(&app, open).await < count, "without the assistant's header, fewer tokens");

        let cases: &[(&str, Value, StatusCode, &str)] = &[
            ("/tokenize", json!({}), StatusCode::BAD_REQUEST, "prompt"),
            ("/tokenize", json!({"prompt": 5}), StatusCode::BAD_REQUEST, "prompt"),
            ("/tokenize", json!({"prompt": "a", "messages": messages}), StatusCode::BAD_REQUEST, "messages"),
            ("/tokenize", json!({"messages": "hi"}), StatusCode::BAD_REQUEST, "messages"),
            (
                "/tokenize",
                json!({"messages": [{"role": "robot", "content": "x"}]}),
                StatusCode::BAD_REQUEST,
                "messages[0].role",
            ),
            (
                "/tokenize",
                json!({"prompt": "a", "add_special_tokens": "yes"}),
                StatusCode::BAD_REQUEST,
                "add_special_tokens",
            ),
            (
                "/tokenize",
                json!({"messages": messages, "continue_final_message": true}),
                StatusCode::BAD_REQUEST,
                "continue_final_message",
            ),
            ("/tokenize", json!({"prompt": "a", "model": "gpt-4o"}), StatusCode::NOT_FOUND, "model"),
            ("/detokenize", json!({}), StatusCode::BAD_REQUEST, "tokens"),
            ("/detokenize", json!({"tokens": "abc"}), StatusCode::BAD_REQUEST, "tokens"),
            ("/detokenize", json!({"tokens": [1, 49152]}), StatusCode::BAD_REQUEST, "tokens"),
            ("/detokenize", json!({"tokens": [-1]}), StatusCode::BAD_REQUEST, "tokens"),
            ("/detokenize", json!({"tokens": [1.5]}), StatusCode::BAD_REQUEST, "tokens"),
        ];
        for (path, body, status, param) in cases {
            let r = call(&app, "POST", path, &body.to_string(), None).await;
            assert_eq!(r.status, *status, "{path} {body}: {}", r.text);
            assert_eq!(r.param().as_deref(), Some(*param), "{path} {body}: {}", r.text);
        }
        let r = call(&app, "POST", "/detokenize", &json!({"tokens": [1, 49152]}).to_string(), None).await;
        assert!(r.json()["error"]["message"].as_str().unwrap().contains("tokens[1] = 49152"), "{}", r.text);
        for path in ["/tokenize", "/detokenize"] {
            let r = call(&app, "POST", path, "{nope", None).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
            let r = call(&app, "GET", path, "", None).await;
            assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{}", r.text);
        }
    });
}
