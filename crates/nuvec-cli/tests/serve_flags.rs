//! `nuvec serve`'s engine flags and its shutdown, end to end on the default SmolLM2 model: the
//! KV cache sized in bytes, a context limit, prompt-lookup speculation, flags refused with the
//! reason, and SIGTERM letting the requests in flight finish within the grace period and ending
//! the rest with an error.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::gguf;
use common::served::{generate, Served};

/// `nuvec serve ARGS` that must fail: its stderr.
fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec"))
        .args(["serve", "--model", &gguf(), "--port", "0"])
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{args:?} was served");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// POSTs `body` to `path` with curl: (status, body).
fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let url = format!("{base}{path}");
    let out = Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}", "-H", "content-type: application/json", "--data-binary"])
        .arg(body.to_string())
        .arg(&url)
        .output()
        .expect("curl (scripts/setup-serve-tests.sh installs it)");
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, status) = text.rsplit_once('\n').unwrap();
    (status.parse().unwrap(), serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}")))
}

/// A gauge's value from `/metrics`.
fn gauge(base: &str, name: &str) -> f64 {
    let out = Command::new("curl").args(["-sS", &format!("{base}/metrics")]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text.lines().find(|l| l.starts_with(name) && !l.starts_with('#')).unwrap_or_else(|| panic!("{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn flags_the_server_cannot_honour_are_refused_with_the_reason() {
    let e = refused(&["--kv-bits", "7"]);
    assert!(e.contains("--kv-bits 7") && e.contains("bits = 7"), "{e}");
    let e = refused(&["--kv-bits", "8", "--kv-group-size", "48"]);
    assert!(e.contains("--kv-group-size 48"), "{e}");
    let e = refused(&["--prompt-cache-bytes", "1"]);
    assert!(e.contains("--prompt-cache-bytes") && e.contains("less than one cache block"), "{e}");
    let e = refused(&["--prompt-cache-bytes", "lots"]);
    assert!(e.contains("not a size in bytes"), "{e}");
    let e = refused(&["--memory-fraction", "2"]);
    assert!(e.contains("--memory-fraction"), "{e}");
    let e = refused(&["--token-budget", "4"]);
    assert!(e.contains("--token-budget") && e.contains("max_batch"), "{e}");
    let e = refused(&["--ctx-size", "100000"]);
    assert!(e.contains("--ctx-size") && e.contains("above the model's context"), "{e}");
    let e = refused(&["--shutdown-grace", "-1"]);
    assert!(e.contains("--shutdown-grace"), "{e}");
}

#[test]
fn the_cache_is_sized_in_bytes_and_the_context_limit_holds() {
    let small = Served::start(&["--prompt-cache-bytes", "4M", "--decode-concurrency", "4"]);
    let blocks_small = gauge(&small.base, "nuvec:kv_cache_blocks_total");
    drop(small);
    let big = Served::start(&["--prompt-cache-bytes", "8MiB", "--ctx-size", "64"]);
    let blocks_big = gauge(&big.base, "nuvec:kv_cache_blocks_total");
    // The same bytes per block, so twice the bytes hold twice the blocks (to the one that
    // does not fit whole).
    assert!(blocks_small >= 1.0, "{blocks_small}");
    assert!(blocks_big == 2.0 * blocks_small || blocks_big == 2.0 * blocks_small + 1.0, "{blocks_small} {blocks_big}");

    // --ctx-size 64: a longer prompt is refused; an answer that fills the context ends there.
    let long = "word ".repeat(80);
    let (status, body) = post(&big.base, "/v1/completions", &json!({"prompt": long, "max_tokens": 4}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    let request = json!({"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": true});
    let (status, body) = post(&big.base, "/v1/completions", &request);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    let usage = &body["usage"];
    assert_eq!(usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap(), 64, "{body}");
}

#[test]
fn a_quantized_cache_holds_more_and_answers_as_generate_with_kv_bits() {
    let plain = Served::start(&["--prompt-cache-bytes", "4M"]);
    let blocks_plain = gauge(&plain.base, "nuvec:kv_cache_blocks_total");
    drop(plain);
    let served = Served::start(&["--prompt-cache-bytes", "4M", "--kv-bits", "4"]);
    // f16 keys and values (a GGUF's cache type) take 2 bytes a value; 4-bit ones half a byte,
    // plus an f32 scale and bias per 64.
    let blocks = gauge(&served.base, "nuvec:kv_cache_blocks_total");
    assert!(blocks >= 3.0 * blocks_plain, "{blocks_plain} blocks plain, {blocks} quantized");
    let question = "Write one sentence about the sea.";
    let expected = generate(&["--prompt", question, "-m", "24", "--kv-bits", "4", "--quantized-kv-start", "0"]);
    let unquantized = generate(&["--prompt", question, "-m", "24"]);
    assert_ne!(expected, unquantized, "a prompt whose answer shows the quantization");
    let body = json!({"messages": [{"role": "user", "content": question}], "max_tokens": 24});
    for _ in 0..2 {
        let (status, answer) = post(&served.base, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["choices"][0]["message"]["content"], expected.as_str(), "{answer}");
    }
    eprintln!("4-bit KV: {expected:?}; unquantized: {unquantized:?}");
}

/// `question`'s served answer held to `nuvec generate`'s (40 tokens), then the guesses /metrics
/// counts: (the answer, drafted, accepted).
fn speculative_answer(served: &Served, question: &str) -> (String, f64, f64) {
    let expected = generate(&["--prompt", question, "-m", "40"]);
    let body = json!({"messages": [{"role": "user", "content": question}], "max_tokens": 40});
    let (status, answer) = post(&served.base, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], expected.as_str(), "{answer}");
    let drafted = gauge(&served.base, "nuvec:spec_decode_num_draft_tokens_total");
    let accepted = gauge(&served.base, "nuvec:spec_decode_num_accepted_tokens_total");
    (expected, drafted, accepted)
}

#[test]
fn prompt_lookup_answers_as_generate_and_reports_its_guesses() {
    let served = Served::start(&["--prompt-lookup", "--num-draft-tokens", "4"]);
    // An answer that copies its input and repeats itself, where guesses are right.
    let question = "Rewrite this code with the variable x renamed to y: def f(x): return x * x + x";
    let (expected, drafted, accepted) = speculative_answer(&served, question);
    assert!(drafted > 0.0 && accepted > 0.0 && accepted <= drafted, "{accepted} of {drafted} guesses right");
    eprintln!("{expected:?}: {accepted} of {drafted} guesses right");
    drop(served);
    let e = refused(&["--prompt-lookup", "--num-draft-tokens", "0"]);
    assert!(e.contains("--num-draft-tokens"), "{e}");
    let e = refused(&["--prompt-lookup", "--batch-invariant"]);
    assert!(e.contains("--prompt-lookup") && e.contains("--batch-invariant"), "{e}");
}

/// `--draft-model`: the default model as its own draft guesses for the served requests; the
/// answer is `nuvec generate`'s and the guesses (its own greedy picks) are right, as /metrics
/// counts them. A draft of another tokenizer, and the speculation flags without a proposer,
/// are refused.
#[test]
fn a_draft_model_answers_as_generate_and_reports_its_guesses() {
    let served = Served::start(&["--draft-model", &gguf(), "--num-draft-tokens", "3", "--speculation-max-batch", "4"]);
    let question = "Name three colours and say why you like them.";
    let (expected, drafted, accepted) = speculative_answer(&served, question);
    assert!(drafted >= 20.0 && accepted >= 0.8 * drafted, "{accepted} of {drafted} guesses right");
    eprintln!("{expected:?}: {accepted} of {drafted} guesses right");
    drop(served);
    let fixtures = std::env::var("NUVEC_FIXTURES").unwrap_or_else(|_| panic!("NUVEC_FIXTURES is not set"));
    let e = refused(&["--draft-model", &format!("{fixtures}/llama-q4g64")]);
    assert!(e.contains("its tokenizer is not the model's"), "{e}");
    let e = refused(&["--num-draft-tokens", "4"]);
    assert!(e.contains("--prompt-lookup, --draft-model or --mtp"), "{e}");
}

/// `--mtp`: a Qwen3.5 fixture's own (random) multi-token-prediction head guesses for the served
/// requests; the answer is `nuvec generate`'s on the same model, and /metrics counts the
/// guesses. A model without a head is refused.
#[test]
fn an_mtp_head_answers_as_generate_and_reports_its_guesses() {
    let fixtures = std::env::var("NUVEC_FIXTURES").unwrap_or_else(|_| panic!("NUVEC_FIXTURES is not set"));
    let model = format!("{fixtures}/gguf-qwen35-mtp/model.gguf");
    let served = Served::start_model(&model, &["--mtp", "--num-draft-tokens", "2"]);
    let prompt = "The capital of France is";
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec"))
        .args(["generate", "--model", &model, "--verbose", "false", "--ignore-chat-template", "--prompt", prompt])
        .args(["-m", "20"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let expected = String::from_utf8(out.stdout).unwrap();
    let body = json!({"prompt": prompt, "max_tokens": 20, "temperature": 0.0});
    let (status, answer) = post(&served.base, "/v1/completions", &body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["text"].as_str().map(str::trim), Some(expected.trim()), "{answer}");
    let drafted = gauge(&served.base, "nuvec:spec_decode_num_draft_tokens_total");
    assert!(drafted > 0.0, "the head guessed nothing");
    drop(served);
    let e = refused(&["--mtp"]);
    assert!(e.contains("no multi-token-prediction head"), "{e}");
}

/// A streaming completion over a socket of its own, read line by line.
struct Stream {
    lines: BufReader<TcpStream>,
}

impl Stream {
    fn open(base: &str, body: &Value) -> Stream {
        let addr = base.strip_prefix("http://").unwrap();
        let mut socket = TcpStream::connect(addr).unwrap();
        let body = body.to_string();
        write!(
            socket,
            "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Stream { lines: BufReader::new(socket) }
    }

    /// The next `data:` payload (None when the connection closed).
    fn next(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.lines.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(data) = line.trim_end().strip_prefix("data: ") {
                return Some(data.to_string());
            }
        }
    }

    /// The rest: the text of its chunks, and the error object if one came; checks `[DONE]`.
    fn rest(mut self, mut text: String) -> (String, Option<Value>) {
        let mut error = None;
        loop {
            let data = self.next().expect("the stream ended without [DONE]");
            if data == "[DONE]" {
                return (text, error);
            }
            let chunk: Value = serde_json::from_str(&data).unwrap();
            if chunk.get("error").is_some() {
                error = Some(chunk);
            } else if let Some(piece) = chunk["choices"][0]["text"].as_str() {
                text.push_str(piece);
            }
        }
    }
}

#[test]
fn sigterm_finishes_short_requests_and_ends_long_ones_with_an_error() {
    let short = json!({"prompt": "The capital of France is", "max_tokens": 16, "stream": true});
    let served = Served::start(&["--shutdown-grace", "10"]);
    // The reference: the short request alone, before any shutdown.
    let solo = Stream::open(&served.base, &short);
    let (expected, error) = solo.rest(String::new());
    assert!(error.is_none() && !expected.is_empty(), "{error:?}");

    let long = json!({"prompt": "Count:", "max_tokens": 100000, "ignore_eos": true, "stream": true});
    let mut slow = Stream::open(&served.base, &long);
    let first = slow.next().expect("the long request streams");
    let mut fast = Stream::open(&served.base, &short);
    let fast_first = fast.next().expect("the short request streams");
    let chunk: Value = serde_json::from_str(&fast_first).unwrap();
    let fast_text = chunk["choices"][0]["text"].as_str().unwrap().to_string();

    let signalled = Instant::now();
    let status = Command::new("kill").args(["-TERM", &served.child.id().to_string()]).status().unwrap();
    assert!(status.success());
    // The short request in flight finishes whole, as it would alone.
    let (text, error) = fast.rest(fast_text);
    assert!(error.is_none(), "{error:?}: {}", served.log());
    assert_eq!(text, expected);
    // No new connection is taken while draining.
    std::thread::sleep(Duration::from_millis(300));
    let addr = served.addr().to_string();
    let refused = TcpStream::connect(&addr).is_err();
    // The long one is ended after the grace period, with an error saying why.
    let (_, error) = slow.rest(first);
    let waited = signalled.elapsed();
    let error = error.unwrap_or_else(|| panic!("the cut stream carried no error: {}", served.log()));
    assert!(error["error"]["message"].as_str().unwrap().contains("shut down"), "{error}");
    assert!(waited >= Duration::from_secs(10), "ended after {waited:?}, before the grace period");
    assert!(waited < Duration::from_secs(40), "ended after {waited:?}");
    assert!(refused, "a connection was taken while shutting down");

    let mut served = served;
    let exit = served.wait_exit(Duration::from_secs(30));
    assert!(exit.success(), "{exit:?}: {}", served.log());
    std::thread::sleep(Duration::from_millis(100));
    let log = served.log();
    assert!(log.contains("ending the requests still in flight") && log.contains("shut down"), "{log}");
}
