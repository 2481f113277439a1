//! `nuvec serve` end to end: the real binary on a free port with the default SmolLM2 model,
//! driven by curl and by the OpenAI and Anthropic Python SDKs (installed by
//! scripts/setup-serve-tests.sh, which scripts/test.sh runs): answers equal to `nuvec
//! generate`'s through chat completions, the Responses API and the Messages API, streaming and
//! whole, the
//! errors' statuses, concurrent streams that each get their solo answer, and a client that
//! disconnects mid-stream, whose request is cancelled without hurting the others.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::served::{generate, Served};

const QUESTION: &str = "What is the capital of France?";

/// `curl` with `args`: (status, body).
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("curl is needed for this test ({e}); scripts/setup-serve-tests.sh installs it"));
    assert!(out.status.success(), "curl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, status) = text.rsplit_once('\n').unwrap();
    (status.parse().unwrap(), body.to_string())
}

fn post(base: &str, path: &str, body: &Value, extra: &[&str]) -> (u16, String) {
    let url = format!("{base}{path}");
    let body = body.to_string();
    let mut args = vec!["-N", "-H", "content-type: application/json", "--data-binary", &body, &url];
    args.extend(extra);
    curl(&args)
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn chat_body(content: &str, max_tokens: usize) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})
}

/// The `data:` payloads of an event stream, checked to end with `[DONE]` (dropped).
fn events(stream: &str) -> Vec<Value> {
    let data: Vec<&str> = stream.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{stream}");
    data[..data.len() - 1].iter().map(|d| json_of(d)).collect()
}

/// A chat stream's text, checking its chunks' shape.
fn streamed_chat_text(chunks: &[Value]) -> (String, String) {
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant", "{:?}", chunks[0]);
    let mut text = String::new();
    let mut finish = None;
    for c in chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        let Some(choice) = c["choices"].get(0) else { continue };
        assert!(finish.is_none(), "a chunk after the finish reason: {c}");
        if let Some(piece) = choice["delta"]["content"].as_str() {
            text.push_str(piece);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    (text, finish.expect("a finish reason"))
}

#[test]
fn curl_chat_and_completions_answer_as_generate_does() {
    let served = Served::start(&[]);
    let base = &served.base;
    let (status, health) = curl(&[&format!("{base}/health")]);
    assert_eq!(status, 200, "{health}");
    assert_eq!(json_of(&health)["status"], "ok");
    let (_, models) = curl(&[&format!("{base}/v1/models")]);
    assert_eq!(json_of(&models)["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1", "{models}");

    for (prompt, max_tokens) in [(QUESTION, 40), ("Write a haiku about the sea.", 48)] {
        let expected = generate(&["--prompt", prompt, "-m", &max_tokens.to_string()]);
        let (status, body) = post(base, "/v1/chat/completions", &chat_body(prompt, max_tokens), &[]);
        assert_eq!(status, 200, "{body}");
        let whole = json_of(&body);
        assert_eq!(whole["object"], "chat.completion", "{body}");
        assert_eq!(whole["choices"][0]["message"]["content"], expected.as_str(), "{body}");
        let usage = &whole["usage"];
        let completion = usage["completion_tokens"].as_u64().unwrap();
        assert!(completion > 0 && completion <= max_tokens as u64, "{body}");
        assert_eq!(usage["total_tokens"].as_u64(), Some(usage["prompt_tokens"].as_u64().unwrap() + completion));

        let mut streaming = chat_body(prompt, max_tokens);
        streaming["stream"] = json!(true);
        streaming["stream_options"] = json!({"include_usage": true});
        let (status, stream) = post(base, "/v1/chat/completions", &streaming, &[]);
        assert_eq!(status, 200, "{stream}");
        let chunks = events(&stream);
        let (text, finish) = streamed_chat_text(&chunks);
        assert_eq!(text, expected, "{stream}");
        assert_eq!(finish, whole["choices"][0]["finish_reason"].as_str().unwrap());
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"], json!([]), "the usage chunk comes last: {last}");
        for count in ["prompt_tokens", "completion_tokens", "total_tokens"] {
            assert_eq!(last["usage"][count], usage[count], "{last}");
        }
        // The same prompt again: its full blocks of 16 but the last token come from the prefix
        // cache, and the answer is the same.
        let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
        let cached = last["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert_eq!(cached, (prompt_tokens - 1) / 16 * 16, "{last}");
        eprintln!("{prompt:?} -> {expected:?}");
    }
    assert!(generate(&["--prompt", QUESTION, "-m", "40"]).contains("Paris"));

    // A completion is the raw prompt's continuation, as `generate --ignore-chat-template`
    // (which prints it without the first leading space, as mlx_lm.generate does).
    let prompt = "The capital of France is";
    let expected = generate(&["--prompt", prompt, "-m", "12", "--ignore-chat-template"]);
    let (status, body) = post(base, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 12}), &[]);
    assert_eq!(status, 200, "{body}");
    let text = json_of(&body)["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(text.strip_prefix(' ').unwrap_or(&text), expected, "{body}");
    let (_, stream) = post(base, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 12, "stream": true}), &[]);
    let streamed: String =
        events(&stream).iter().map(|c| c["choices"][0]["text"].as_str().unwrap().to_string()).collect();
    assert_eq!(streamed, text);
}

#[test]
fn curl_cache_salts_keep_prompts_apart() {
    // vLLM's cache_salt: a prompt's cached blocks serve only requests of the same salt.
    let served = Served::start(&[]);
    let ask = |salt: Option<&str>| {
        let mut body = chat_body(QUESTION, 4);
        if let Some(s) = salt {
            body["cache_salt"] = json!(s);
        }
        let (status, text) = post(&served.base, "/v1/chat/completions", &body, &[]);
        assert_eq!(status, 200, "{text}");
        let usage = json_of(&text)["usage"].clone();
        let prompt = usage["prompt_tokens"].as_u64().unwrap();
        (usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), (prompt - 1) / 16 * 16)
    };
    for (salt, hit) in [(Some("a"), false), (Some("a"), true), (Some("b"), false), (None, false), (None, true)] {
        let (cached, full) = ask(salt);
        assert_eq!(cached, if hit { full } else { 0 }, "salt {salt:?}");
    }
    let mut empty = chat_body(QUESTION, 4);
    empty["cache_salt"] = json!("");
    let (status, body) = post(&served.base, "/v1/chat/completions", &empty, &[]);
    assert_eq!(status, 400, "{body}");
    assert_eq!(json_of(&body)["error"]["param"], "cache_salt", "{body}");
}

#[test]
fn curl_errors_have_their_statuses() {
    let served = Served::start(&[]);
    let base = &served.base;
    let error = |status: u16, body: &str, param: Option<&str>| {
        let e = json_of(body);
        assert!(e["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
        assert!(e["error"]["type"].is_string(), "{body}");
        assert_eq!(e["error"]["param"].as_str(), param, "{status}: {body}");
    };
    let mut hot = chat_body(QUESTION, 8);
    hot["temperature"] = json!(-1);
    let (status, body) = post(base, "/v1/chat/completions", &hot, &[]);
    assert_eq!(status, 400, "{body}");
    error(status, &body, Some("temperature"));
    let mut typed = chat_body(QUESTION, 8);
    typed["max_tokens"] = json!("eight");
    let (status, body) = post(base, "/v1/chat/completions", &typed, &[]);
    assert_eq!(status, 400, "{body}");
    error(status, &body, Some("max_tokens"));
    let (status, body) = curl(&[
        "-H",
        "content-type: application/json",
        "-d",
        "{\"messages\": [",
        &format!("{base}/v1/chat/completions"),
    ]);
    assert_eq!(status, 400, "{body}");
    error(status, &body, None);
    let mut many = chat_body(QUESTION, 8);
    many["n"] = json!(17);
    let (status, body) = post(base, "/v1/chat/completions", &many, &[]);
    assert_eq!(status, 400, "{body}");
    error(status, &body, Some("n"));

    let mut other = chat_body(QUESTION, 8);
    other["model"] = json!("gpt-4o");
    let (status, body) = post(base, "/v1/chat/completions", &other, &[]);
    assert_eq!(status, 404, "{body}");
    error(status, &body, Some("model"));
    let (status, body) = curl(&[&format!("{base}/v1/no/such/route")]);
    assert_eq!(status, 404, "{body}");
    error(status, &body, None);

    // A prompt longer than the model's context (8192 positions).
    let long: Vec<u32> = (0..9000).map(|i| 100 + i % 1000).collect();
    let (status, body) = post(base, "/v1/completions", &json!({"prompt": long, "max_tokens": 4}), &[]);
    assert_eq!(status, 400, "{body}");
    assert_eq!(json_of(&body)["error"]["code"], "context_length_exceeded", "{body}");

    // A body over the 16 MiB limit.
    let dir = std::env::temp_dir().join(format!("nuvec-serve-413-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("big.json");
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(17 << 20));
    std::fs::write(&file, big).unwrap();
    let (status, body) = curl(&[
        "-H",
        "content-type: application/json",
        "--data-binary",
        &format!("@{}", file.display()),
        &format!("{base}/v1/completions"),
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(status, 413, "{body}");
    error(status, &body, None);

    // None of that hurt the server.
    let (status, body) = post(base, "/v1/chat/completions", &chat_body(QUESTION, 20), &[]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Paris"), "{body}");
    assert!(!served.log().contains("panicked"), "{}", served.log());
}

#[test]
fn curl_401_without_the_api_key() {
    let served = Served::start(&["--api-key", "sk-local-test"]);
    let base = &served.base;
    let body = chat_body(QUESTION, 8);
    let (status, text) = post(base, "/v1/chat/completions", &body, &[]);
    assert_eq!(status, 401, "{text}");
    assert_eq!(json_of(&text)["error"]["code"], "invalid_api_key", "{text}");
    let (status, text) = post(base, "/v1/chat/completions", &body, &["-H", "authorization: Bearer sk-wrong"]);
    assert_eq!(status, 401, "{text}");
    let (status, text) = curl(&[&format!("{base}/v1/models")]);
    assert_eq!(status, 401, "{text}");
    let (status, text) = post(base, "/v1/chat/completions", &body, &["-H", "authorization: Bearer sk-local-test"]);
    assert_eq!(status, 200, "{text}");
    let (status, text) = curl(&[&format!("{base}/health")]);
    assert_eq!(status, 200, "/health is open: {text}");
}

/// Runs the SDK script `script` (in this folder) with `args` under the pinned SDKs' python
/// against `served`; it must end by printing "ok".
fn run_sdk_script(script: &str, args: &[&str], served: &Served) {
    let python = std::env::var("NUVEC_OPENAI_PYTHON").unwrap_or_else(|_| {
        panic!("NUVEC_OPENAI_PYTHON is not set: run scripts/test.sh (it runs scripts/setup-serve-tests.sh)")
    });
    let script = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&python).arg(&script).args(args).output().unwrap_or_else(|e| panic!("{python}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success() && stdout.lines().last() == Some("ok"),
        "{stdout}\n{stderr}\nserver:\n{}",
        served.log()
    );
}

#[test]
fn the_openai_sdk_drives_the_server() {
    let expected = generate(&["--prompt", QUESTION, "-m", "40"]);
    let served = Served::start(&["--api-key", "sk-sdk-test"]);
    run_sdk_script("serve_openai.py", &[&format!("{}/v1", served.base), "sk-sdk-test", &expected], &served);
}

#[test]
fn structured_outputs_through_the_sdk_and_curl() {
    let served = Served::start(&["--api-key", "sk-structured"]);
    run_sdk_script("serve_structured.py", &[&format!("{}/v1", served.base), "sk-structured"], &served);
    // curl: a json_object answer is a JSON object; a constraint with ignore_eos, or two at once,
    // is a 400 naming the field.
    let key = ["-H", "authorization: Bearer sk-structured"];
    let mut body = chat_body("A JSON object with one key, city.", 60);
    body["response_format"] = json!({"type": "json_object"});
    let (status, text) = post(&served.base, "/v1/chat/completions", &body, &key);
    assert_eq!(status, 200, "{text}");
    let content = json_of(&text)["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(json_of(&content).is_object(), "{content}");
    for (extra, param) in [
        (json!({"ignore_eos": true}), "ignore_eos"),
        (json!({"structured_outputs": {"regex": "a+"}}), "structured_outputs"),
        (json!({"response_format": {"type": "json_schema"}}), "response_format.json_schema"),
        (json!({"response_format": {"type": "yaml"}}), "response_format.type"),
    ] {
        let mut bad = body.clone();
        for (k, v) in extra.as_object().unwrap() {
            bad[k] = v.clone();
        }
        let (status, text) = post(&served.base, "/v1/chat/completions", &bad, &key);
        assert_eq!(status, 400, "{extra}: {text}");
        assert_eq!(json_of(&text)["error"]["param"], param, "{text}");
    }
}

/// tool_choice "required" and a named function on a random Qwen3 model with Qwen3's chat
/// template (the oracle's fixtures, linked into one model directory): serve_tools_forced.py.
#[test]
fn forced_tool_calls_through_the_sdk() {
    let fixtures =
        std::path::PathBuf::from(std::env::var("NUVEC_FIXTURES").expect("NUVEC_FIXTURES: run scripts/test.sh"));
    let dir = std::env::temp_dir().join(format!("nuvec-serve-tools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (from, names) in [
        ("qwen3-q4g64", &["config.json", "model.safetensors", "model.safetensors.index.json"][..]),
        ("tool_chats/qwen3", &["tokenizer.json", "tokenizer_config.json"][..]),
    ] {
        for name in names {
            let (src, dst) = (fixtures.join(from).join(name), dir.join(name));
            if src.exists() && !dst.exists() {
                std::os::unix::fs::symlink(&src, &dst).unwrap();
            }
        }
    }
    let served = Served::start_model(dir.to_str().unwrap(), &["--api-key", "sk-tools"]);
    run_sdk_script("serve_tools_forced.py", &[&format!("{}/v1", served.base), "sk-tools"], &served);
    drop(served);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_anthropic_sdk_drives_the_messages_api() {
    let expected = generate(&["--prompt", QUESTION, "-m", "40"]);
    let served = Served::start(&["--api-key", "sk-anthropic-test"]);
    let args = [&served.base[..], "sk-anthropic-test", "SmolLM2-135M-Instruct.Q4_1", &expected];
    run_sdk_script("serve_anthropic.py", &args, &served);
}

/// Sends a streaming chat request over a bare socket, reads `events` chunks, then hangs up.
fn stream_then_disconnect(base: &str, body: &Value, events: usize) -> usize {
    let addr = base.strip_prefix("http://").unwrap();
    let mut socket = TcpStream::connect(addr).unwrap();
    let body = body.to_string();
    write!(
        socket,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while seen.matches("data: ").count() < events {
        let n = socket.read(&mut buf).unwrap();
        assert!(n > 0, "the server closed the stream early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    seen.matches("data: ").count()
}

fn health(base: &str) -> Value {
    let (status, body) = curl(&[&format!("{base}/health")]);
    assert_eq!(status, 200, "{body}");
    json_of(&body)
}

#[test]
fn concurrent_streams_get_their_solo_answers_and_a_disconnect_is_cancelled() {
    let served = Served::start(&[]);
    let base = served.base.clone();
    let prompts = [
        "What is the capital of France?",
        "Name three primary colors.",
        "Write a haiku about the sea.",
        "What is 2 + 2?",
    ];
    let max_tokens = 40;
    // Solo: one request at a time.
    let solo: Vec<String> = prompts
        .iter()
        .map(|p| {
            let (status, body) = post(&base, "/v1/chat/completions", &chat_body(p, max_tokens), &[]);
            assert_eq!(status, 200, "{body}");
            json_of(&body)["choices"][0]["message"]["content"].as_str().unwrap().to_string()
        })
        .collect();

    // Together, streamed, with a client that leaves after a few chunks of a long answer.
    let mut long = chat_body("Tell me a very long story about a dragon.", 4000);
    long["stream"] = json!(true);
    long["ignore_eos"] = json!(true);
    let leaver = {
        let base = base.clone();
        std::thread::spawn(move || stream_then_disconnect(&base, &long, 4))
    };
    let threads: Vec<_> = prompts
        .iter()
        .map(|p| {
            let base = base.clone();
            let mut body = chat_body(p, max_tokens);
            body["stream"] = json!(true);
            std::thread::spawn(move || {
                let (status, stream) = post(&base, "/v1/chat/completions", &body, &[]);
                assert_eq!(status, 200, "{stream}");
                streamed_chat_text(&events(&stream)).0
            })
        })
        .collect();
    let together: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(leaver.join().unwrap() >= 4);
    for ((p, s), t) in prompts.iter().zip(&solo).zip(&together) {
        assert_eq!(s, t, "{p:?}: batched with others, the answer changed");
    }

    // The leaver's request (4000 tokens, far from done) is cancelled, and the engine goes idle.
    let start = Instant::now();
    let mut h = health(&base);
    while h["requests"]["running"] != 0 || h["requests"]["waiting"] != 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "the disconnected request still runs: {h}");
        std::thread::sleep(Duration::from_millis(100));
        h = health(&base);
    }
    assert_eq!(h["requests"]["cancelled"], 1, "{h}");
    assert_eq!(h["requests"]["completed"], 8, "{h}");
    assert!(h["requests"]["generated_tokens"].as_u64().unwrap() < 2000, "{h}");
    // And the server still answers.
    let (status, body) = post(&base, "/v1/chat/completions", &chat_body(prompts[0], max_tokens), &[]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["choices"][0]["message"]["content"], solo[0].as_str());
}

#[test]
fn sigterm_shuts_down_gracefully() {
    let mut served = Served::start(&[]);
    let pid = served.child.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success());
    let exit = served.wait_exit(Duration::from_secs(30));
    assert!(exit.success(), "{exit:?}: {}", served.log());
    std::thread::sleep(Duration::from_millis(100));
    assert!(served.log().contains("shut down"), "{}", served.log());
}
