//! The server's routes over engine cores that misbehave on purpose (a request that fails, a
//! step that fails, a step that panics) and over a core that answers every request the same
//! way, to check each field's validation without running a model. The real model over real
//! sockets is tested in crates/nuvec-cli/tests/serve.rs.

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

struct Scripted {
    script: Script,
    next: u64,
    /// (id, tokens left, fails)
    live: Vec<(RequestId, usize, bool)>,
    generated: u64,
}

impl EngineCore for Scripted {
    fn submit(&mut self, prompt: Vec<u32>, options: GenerateOptions) -> nuvec_lm::Result<RequestId> {
        if prompt.is_empty() {
            return Err(nuvec_lm::Error::Invalid("the prompt is empty".into()));
        }
        let id = RequestId(self.next);
        self.next += 1;
        let fails = self.script == Script::FailThirteen && options.max_tokens == 13;
        self.live.push((id, options.max_tokens, fails));
        Ok(id)
    }

    fn step(&mut self) -> nuvec_lm::Result<Vec<Event>> {
        match self.script {
            Script::StepError => return Err(nuvec_lm::Error::Invalid("the device was lost (scripted)".into())),
            Script::StepPanic => panic!("a scripted panic inside the step"),
            _ => {}
        }
        let mut events = vec![];
        for (id, left, fails) in &mut self.live {
            if *fails {
                events.push(Event::Failed { id: *id, error: nuvec_lm::Error::Invalid("scripted failure".into()) });
                events.push(Event::Finished { id: *id, reason: FinishReason::Error });
                *left = 0;
                continue;
            }
            events.push(Event::Token { id: *id, token: 100 + self.generated as u32 % 50 });
            self.generated += 1;
            *left -= 1;
            if *left == 0 {
                events.push(Event::Finished { id: *id, reason: FinishReason::Length });
            }
        }
        self.live.retain(|(_, left, _)| *left > 0);
        Ok(events)
    }

    fn is_busy(&self) -> bool {
        !self.live.is_empty()
    }

    fn cancel(&mut self, _id: RequestId) -> bool {
        false
    }

    fn stats(&self) -> BatcherStats {
        BatcherStats { running: self.live.len(), generated_tokens: self.generated, ..Default::default() }
    }
}

fn server(script: Script, api_key: Option<&str>) -> Server {
    let tokenizer = tokenizer();
    let mut config = ServerConfig::new("scripted-model", &tokenizer);
    config.api_key = api_key.map(str::to_string);
    config.body_limit = 4096;
    config.defaults.max_tokens = 5;
    let info = ModelInfo { vocab_size: 49152, context_length: Some(64) };
    Server::with_engine(tokenizer, info, config, move |engine| {
        engine.run(Scripted { script, next: 0, live: vec![], generated: 0 });
        Ok(())
    })
    .unwrap()
}

struct Reply {
    status: StatusCode,
    request_id: Option<String>,
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
    let request_id = response.headers().get("x-request-id").map(|v| v.to_str().unwrap().to_string());
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    Reply { status, request_id, text: String::from_utf8(bytes.to_vec()).unwrap() }
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
            (json!({"n": 2}), StatusCode::BAD_REQUEST, "n"),
            (json!({"n": "1"}), StatusCode::BAD_REQUEST, "n"),
            (json!({"tools": [{"type": "function"}]}), StatusCode::BAD_REQUEST, "tools[0].function"),
            // SmolLM2's template writes no tool calls.
            (json!({"tools": [{"type": "function", "function": {"name": "f"}}]}), StatusCode::BAD_REQUEST, "tools"),
            (json!({"tool_choice": "required"}), StatusCode::BAD_REQUEST, "tool_choice"),
            (json!({"response_format": {"type": "json_object"}}), StatusCode::BAD_REQUEST, "response_format"),
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
    let info = ModelInfo { vocab_size: 10, context_length: None };
    let started = Server::with_engine(tokenizer, info, config, |_engine| {
        Err(nuvec_lm::Error::Invalid("no memory left for one cache block".into()))
    });
    let error = started.err().expect("it must not start");
    assert!(error.to_string().contains("no memory left"), "{error}");
}
