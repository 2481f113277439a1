//! OpenAI's `n` (several choices per request) on /v1/chat/completions and /v1/completions, over
//! a scripted core whose answer depends only on a request's seed: each choice of a request is
//! checked against the same request sent alone with that choice's seed (seed + i), whole and
//! streamed; the seeds, the cancellations and the queue places the core sees are checked too.
//! The real model's choices are tested in crates/nuvec-cli/tests/serve_choices.rs.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use nuvec_lm::{BatcherStats, Event, FinishReason, GenerateOptions, RequestId, TokenLogprobs, Tokenizer};
use nuvec_server::{EngineCore, ModelInfo, Server, ServerConfig};
use serde_json::{json, Value};
use tokio_stream::StreamExt;
use tower::ServiceExt;

mod common;
use common::{post, runtime};

fn tokenizer() -> Tokenizer {
    let gguf = std::env::var("NUVEC_DEFAULT_GGUF")
        .unwrap_or_else(|_| panic!("NUVEC_DEFAULT_GGUF is not set: run scripts/test.sh"));
    nuvec_lm::load(&gguf).unwrap().1
}

/// The seed whose request fails at its third token.
const FAILING_SEED: u64 = 1013;

/// What the core saw: each submission's id, seed and prompt, and each cancellation.
#[derive(Default)]
struct Log {
    submitted: Vec<(RequestId, Option<u64>, Vec<u32>)>,
    cancelled: Vec<RequestId>,
}

struct Live {
    id: RequestId,
    answer: Vec<u32>,
    at: usize,
    started: bool,
    cached: usize,
    max_tokens: usize,
    /// `ignore_eos`: the answer repeats until max_tokens.
    repeats: bool,
    logprobs: bool,
    fails: bool,
    cancelled: bool,
}

/// A core whose answer to a request is a text naming its seed (" Answer 41: more more"),
/// one token per step for every request in turn; it says `seed % 5` prompt tokens came from
/// the prefix cache.
struct Seeded {
    tokenizer: Tokenizer,
    log: Arc<Mutex<Log>>,
    next: u64,
    live: Vec<Live>,
    /// While false, the core steps without admitting anyone.
    gate: Arc<AtomicBool>,
}

fn answer_text(seed: Option<u64>) -> String {
    match seed {
        Some(s) => format!(" Answer {s}:{}", " more".repeat((s % 3) as usize)),
        None => " Answer unseeded".into(),
    }
}

impl EngineCore for Seeded {
    fn submit(&mut self, prompt: Vec<u32>, options: GenerateOptions) -> nuvec_lm::Result<RequestId> {
        let id = RequestId(self.next);
        self.next += 1;
        let answer = self.tokenizer.encode(&answer_text(options.seed), false)?;
        self.log.lock().unwrap().submitted.push((id, options.seed, prompt.clone()));
        self.live.push(Live {
            id,
            answer,
            at: 0,
            started: false,
            cached: options.seed.map_or(0, |s| (s % 5) as usize).min(prompt.len() - 1),
            max_tokens: options.max_tokens,
            repeats: options.ignore_eos,
            logprobs: options.logprobs.is_some(),
            fails: options.seed == Some(FAILING_SEED),
            cancelled: false,
        });
        Ok(id)
    }

    fn step(&mut self) -> nuvec_lm::Result<Vec<Event>> {
        if !self.gate.load(Ordering::Acquire) || self.live.iter().any(|r| r.repeats) {
            std::thread::sleep(Duration::from_millis(2));
        }
        if !self.gate.load(Ordering::Acquire) {
            return Ok(vec![]);
        }
        let mut events = vec![];
        for r in &mut self.live {
            let id = r.id;
            if r.cancelled {
                events.push(Event::Finished { id, reason: FinishReason::Cancelled });
                r.at = usize::MAX;
                continue;
            }
            if !r.started {
                r.started = true;
                events.push(Event::Started { id, cached_tokens: r.cached });
            }
            if r.fails && r.at == 2 {
                events.push(Event::Failed { id, error: nuvec_lm::Error::Invalid("scripted failure".into()) });
                events.push(Event::Finished { id, reason: FinishReason::Error });
                r.at = usize::MAX;
                continue;
            }
            let token = r.answer[r.at % r.answer.len()];
            if r.logprobs {
                let logprobs = TokenLogprobs { token, logprob: -(r.at as f32 + 1.0) / 8.0, top: vec![] };
                events.push(Event::Logprobs { id, logprobs });
            }
            events.push(Event::Token { id, token });
            r.at += 1;
            if r.at == r.max_tokens {
                events.push(Event::Finished { id, reason: FinishReason::Length });
                r.at = usize::MAX;
            } else if !r.repeats && r.at == r.answer.len() {
                events.push(Event::Finished { id, reason: FinishReason::EndOfSequence });
                r.at = usize::MAX;
            }
        }
        self.live.retain(|r| r.at != usize::MAX);
        Ok(events)
    }

    fn is_busy(&self) -> bool {
        !self.live.is_empty()
    }

    fn cancel(&mut self, id: RequestId) -> bool {
        self.log.lock().unwrap().cancelled.push(id);
        self.live.iter_mut().filter(|r| r.id == id).for_each(|r| r.cancelled = true);
        true
    }

    fn stats(&self) -> BatcherStats {
        let started = self.live.iter().filter(|r| r.started).count();
        BatcherStats { running: started, waiting: self.live.len() - started, ..Default::default() }
    }
}

struct Served {
    server: Server,
    log: Arc<Mutex<Log>>,
    gate: Arc<AtomicBool>,
}

fn serve(max_queue: usize) -> Served {
    let tokenizer = tokenizer();
    let mut config = ServerConfig::new("scripted", &tokenizer);
    config.max_queue = max_queue;
    config.defaults.max_tokens = 64;
    let info = ModelInfo { vocab_size: tokenizer.vocab_size(), context_length: None, adapters: vec![] };
    let log = Arc::new(Mutex::new(Log::default()));
    let gate = Arc::new(AtomicBool::new(true));
    let core = Seeded { tokenizer: tokenizer.clone(), log: log.clone(), next: 0, live: vec![], gate: gate.clone() };
    let server = Server::with_engine(tokenizer, info, config, move |engine| {
        engine.run(core);
        Ok(())
    })
    .unwrap();
    Served { server, log, gate }
}

fn path(chat: bool) -> &'static str {
    if chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    }
}

/// A body with log-probabilities asked for, plus `extra`.
fn body(chat: bool, extra: Value) -> Value {
    let mut body = match chat {
        true => json!({"messages": [{"role": "user", "content": "Say something."}], "logprobs": true}),
        false => json!({"prompt": "Say something.", "logprobs": 1}),
    };
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

async fn ok(app: &axum::Router, path: &str, body: &Value) -> Value {
    let (status, text) = post(app, path, body, &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// The `data:` payloads of a stream; `[DONE]` as the string "[DONE]".
fn sse(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let data = block.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data event: {block:?}"));
            match data {
                "[DONE]" => Value::from("[DONE]"),
                _ => serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}")),
            }
        })
        .collect()
}

/// The answers of the request sent alone with seeds `seed`, `seed + 1`, ...: their choice 0
/// each, and their usage.
async fn solo(app: &axum::Router, chat: bool, seed: u64, n: usize, extra: &Value) -> Vec<(Value, Value)> {
    let mut answers = vec![];
    for i in 0..n as u64 {
        let mut b = body(chat, extra.clone());
        b["seed"] = (seed + i).into();
        let r = ok(app, path(chat), &b).await;
        assert_eq!(r["choices"].as_array().unwrap().len(), 1, "{r}");
        answers.push((r["choices"][0].clone(), r["usage"].clone()));
    }
    answers
}

/// The usage a request of the `solo` answers' choices reports: the prompt once, the first
/// choice's cached tokens, the answers summed.
fn summed(solo: &[(Value, Value)]) -> Value {
    let first = &solo[0].1;
    let completion: u64 = solo.iter().map(|(_, u)| u["completion_tokens"].as_u64().unwrap()).sum();
    let prompt = first["prompt_tokens"].as_u64().unwrap();
    json!({
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "prompt_tokens_details": first["prompt_tokens_details"],
    })
}

#[test]
fn whole_choices_equal_their_solo_runs_with_seed_plus_i() {
    let served = serve(256);
    let app = served.server.router();
    runtime().block_on(async {
        for chat in [true, false] {
            // max_tokens 6 cuts some answers (seed 41's has two " more"), not others.
            let extra = json!({"max_tokens": 6});
            let solo = solo(&app, chat, 41, 3, &extra).await;
            let texts: HashSet<String> = solo.iter().map(|(c, _)| c.to_string()).collect();
            assert_eq!(texts.len(), 3, "the scripted seeds give distinct answers: {solo:?}");
            let reasons: HashSet<&Value> = solo.iter().map(|(c, _)| &c["finish_reason"]).collect();
            assert_eq!(reasons.len(), 2, "some cut, some not: {solo:?}");

            let mut b = body(chat, extra.clone());
            b["seed"] = 41.into();
            b["n"] = 3.into();
            let r = ok(&app, path(chat), &b).await;
            let choices = r["choices"].as_array().unwrap();
            assert_eq!(choices.len(), 3, "{r}");
            for (i, (choice, (alone, _))) in choices.iter().zip(&solo).enumerate() {
                assert_eq!(choice["index"], i, "{r}");
                let mut choice = choice.clone();
                choice["index"] = 0.into();
                assert_eq!(&choice, alone, "choice {i} against seed {} alone", 41 + i);
            }
            assert_eq!(r["usage"], summed(&solo), "{r}");
            assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 1, "seed 41's: {r}");
        }
    });
}

/// Choice `index`'s chunks of a stream, in order.
fn of_choice(chunks: &[Value], index: usize) -> Vec<&Value> {
    chunks.iter().filter(|c| c["choices"].get(0).is_some_and(|c| c["index"] == index)).collect()
}

#[test]
fn streamed_choices_interleave_each_with_its_index_and_end_once() {
    let served = serve(256);
    let app = served.server.router();
    runtime().block_on(async {
        for chat in [true, false] {
            let extra = json!({"max_tokens": 6});
            let solo = solo(&app, chat, 41, 3, &extra).await;
            let mut b = body(chat, extra.clone());
            b["seed"] = 41.into();
            b["n"] = 3.into();
            b["stream"] = true.into();
            b["stream_options"] = json!({"include_usage": true});
            let (status, text) = post(&app, path(chat), &b, &[]).await;
            assert_eq!(status, StatusCode::OK, "{text}");
            let events = sse(&text);
            let (last, rest) = events.split_last().unwrap();
            assert_eq!(last, "[DONE]", "{text}");
            let (usage, chunks) = rest.split_last().unwrap();
            assert_eq!(usage["choices"], json!([]), "{text}");
            assert_eq!(usage["usage"], summed(&solo), "{text}");
            let indices: Vec<u64> = chunks
                .iter()
                .map(|c| {
                    let choices = c["choices"].as_array().unwrap_or_else(|| panic!("{c}"));
                    assert_eq!(choices.len(), 1, "{c}");
                    assert!(c["usage"].is_null(), "{c}");
                    choices[0]["index"].as_u64().unwrap()
                })
                .collect();
            assert!(indices.iter().all(|&i| i < 3), "{indices:?}");
            assert!(indices.windows(2).any(|w| w[0] > w[1]), "the choices interleave as they come: {indices:?}");
            for (i, (alone, _)) in solo.iter().enumerate() {
                let mine = of_choice(chunks, i);
                let (finish, body) = mine.split_last().unwrap();
                let choice = |c: &Value| c["choices"][0].clone();
                assert_eq!(choice(finish)["finish_reason"], alone["finish_reason"], "choice {i}: {text}");
                assert!(body.iter().all(|c| choice(c)["finish_reason"].is_null()), "choice {i}: {text}");
                let (text_of, logprobs): (String, Vec<Value>) = match chat {
                    true => {
                        assert_eq!(choice(body[0])["delta"], json!({"role": "assistant", "content": ""}), "{text}");
                        let content =
                            mine.iter().filter_map(|c| choice(c)["delta"]["content"].as_str().map(String::from));
                        let lps = mine
                            .iter()
                            .flat_map(|c| choice(c)["logprobs"]["content"].as_array().cloned().unwrap_or_default());
                        (content.collect(), lps.collect())
                    }
                    false => {
                        let content = mine.iter().map(|c| choice(c)["text"].as_str().unwrap().to_string());
                        let lps = mine.iter().flat_map(|c| {
                            let lp = &choice(c)["logprobs"];
                            let at = |k: &str| lp[k].as_array().cloned().unwrap_or_default();
                            at("tokens")
                                .into_iter()
                                .zip(at("text_offset"))
                                .map(|(t, o)| json!([t, o]))
                                .collect::<Vec<_>>()
                        });
                        (content.collect(), lps.collect())
                    }
                };
                let (alone_text, alone_logprobs): (&str, Vec<Value>) = match chat {
                    true => (
                        alone["message"]["content"].as_str().unwrap(),
                        alone["logprobs"]["content"].as_array().unwrap().clone(),
                    ),
                    false => {
                        let lp = &alone["logprobs"];
                        let at = |k: &str| lp[k].as_array().unwrap().clone();
                        let pairs = at("tokens").into_iter().zip(at("text_offset")).map(|(t, o)| json!([t, o]));
                        (alone["text"].as_str().unwrap(), pairs.collect())
                    }
                };
                assert_eq!(text_of, alone_text, "choice {i}: {text}");
                assert_eq!(logprobs, alone_logprobs, "choice {i}'s log-probabilities: {text}");
            }
        }
    });
}

/// The seeds the core was given for the submissions after the first `from`.
fn seeds_since(log: &Mutex<Log>, from: usize) -> Vec<Option<u64>> {
    log.lock().unwrap().submitted[from..].iter().map(|(_, seed, _)| *seed).collect()
}

#[test]
fn each_choice_reaches_the_engine_with_seed_plus_i_and_the_same_prompt() {
    let served = serve(256);
    let app = served.server.router();
    runtime().block_on(async {
        let count = || served.log.lock().unwrap().submitted.len();
        for (extra, seeds) in [
            (json!({"n": 3, "seed": 7}), vec![Some(7), Some(8), Some(9)]),
            (json!({"n": 3}), vec![None, None, None]),
            // -1 is the seed u64::MAX; the next choice's wraps to 0.
            (json!({"n": 2, "seed": -1}), vec![Some(u64::MAX), Some(0)]),
            (json!({"seed": 7}), vec![Some(7)]),
        ] {
            for chat in [true, false] {
                let before = count();
                let r = ok(&app, path(chat), &body(chat, extra.clone())).await;
                assert_eq!(r["choices"].as_array().unwrap().len(), seeds.len(), "{r}");
                assert_eq!(seeds_since(&served.log, before), seeds, "{extra}");
                let log = served.log.lock().unwrap();
                let prompts: HashSet<&Vec<u32>> = log.submitted[before..].iter().map(|(_, _, p)| p).collect();
                assert_eq!(prompts.len(), 1, "every choice gets the one prompt");
            }
        }
        // The responses and messages protocols have no `n`: it is ignored, one answer comes.
        let messages = json!([{"role": "user", "content": "Say something."}]);
        for (path, body) in [
            ("/v1/responses", json!({"input": "Say something.", "n": 3})),
            ("/v1/messages", json!({"messages": messages, "max_tokens": 8, "n": 3})),
        ] {
            let before = count();
            let r = ok(&app, path, &body).await;
            assert_eq!(count() - before, 1, "{path}: {r}");
            assert!(r.get("choices").is_none(), "{path}: {r}");
        }
    });
}

/// Waits until the core has cancelled every one of `ids`.
async fn cancelled(log: &Mutex<Log>, ids: &[RequestId]) {
    let start = Instant::now();
    loop {
        let done = {
            let log = log.lock().unwrap();
            ids.iter().all(|id| log.cancelled.contains(id))
        };
        if done {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{ids:?} were never all cancelled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn ids_since(log: &Mutex<Log>, from: usize) -> Vec<RequestId> {
    log.lock().unwrap().submitted[from..].iter().map(|(id, _, _)| *id).collect()
}

#[test]
fn a_client_that_leaves_cancels_every_choice() {
    let served = serve(256);
    let app = served.server.router();
    runtime().block_on(async {
        for chat in [true, false] {
            let before = served.log.lock().unwrap().submitted.len();
            let b = body(chat, json!({"n": 3, "seed": 7, "ignore_eos": true, "max_tokens": 100000, "stream": true}));
            let request = Request::post(path(chat)).header("content-type", "application/json");
            let response = app.clone().oneshot(request.body(Body::from(b.to_string())).unwrap()).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let mut stream = response.into_body().into_data_stream();
            let mut seen = String::new();
            while !(0..3).all(|i| seen.contains(&format!("\"index\":{i}"))) {
                let bytes = stream.next().await.expect("the stream goes on").unwrap();
                seen.push_str(std::str::from_utf8(&bytes).unwrap());
            }
            let ids = ids_since(&served.log, before);
            assert_eq!(ids.len(), 3);
            assert!(served.log.lock().unwrap().cancelled.iter().all(|id| !ids.contains(id)));
            drop(stream);
            cancelled(&served.log, &ids).await;
        }
    });
}

#[test]
fn a_failing_choice_fails_the_request_and_cancels_the_others() {
    let served = serve(256);
    let app = served.server.router();
    runtime().block_on(async {
        for chat in [true, false] {
            for stream in [false, true] {
                let before = served.log.lock().unwrap().submitted.len();
                // Choice 2's seed fails at its third token; the others would go on for long.
                let seed = FAILING_SEED - 2;
                let extra = json!({"n": 3, "seed": seed, "ignore_eos": true, "max_tokens": 2000, "stream": stream});
                let (status, text) = post(&app, path(chat), &body(chat, extra), &[]).await;
                let error = match stream {
                    false => {
                        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{text}");
                        serde_json::from_str::<Value>(&text).unwrap()
                    }
                    true => {
                        assert_eq!(status, StatusCode::OK, "{text}");
                        let events = sse(&text);
                        assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1, "{text}");
                        let n = events.len();
                        assert_eq!(events[n - 1], "[DONE]", "{text}");
                        events[n - 2].clone()
                    }
                };
                let message = error["error"]["message"].as_str().unwrap_or_else(|| panic!("{text}"));
                assert!(message.contains("scripted failure"), "{text}");
                let ids = ids_since(&served.log, before);
                cancelled(&served.log, &[ids[0], ids[1]]).await;
            }
        }
    });
}

async fn waiting(app: &axum::Router, count: u64) {
    let start = Instant::now();
    loop {
        let request = Request::get("/health").body(Body::empty()).unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let health: Value = serde_json::from_slice(&bytes).unwrap();
        if health["requests"]["waiting"] == count {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never {count} waiting: {health}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn the_queue_counts_every_choice() {
    let served = serve(4);
    let app = served.server.router();
    runtime().block_on(async {
        // More choices than the whole queue holds can never be served: 400, naming n.
        for chat in [true, false] {
            let (status, text) = post(&app, path(chat), &body(chat, json!({"n": 5})), &[]).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
            let error: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(error["error"]["param"], "n", "{text}");
            assert!(error["error"]["message"].as_str().unwrap().contains("--max-queue 4"), "{text}");
        }
        served.gate.store(false, Ordering::Release);
        let three = {
            let app = app.clone();
            tokio::spawn(async move { post(&app, "/v1/completions", &body(false, json!({"n": 3})), &[]).await })
        };
        waiting(&app, 3).await;
        // One place is left: two choices do not fit (429), one does.
        let (status, text) = post(&app, "/v1/chat/completions", &body(true, json!({"n": 2})), &[]).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
        assert!(text.contains("4 requests"), "{text}");
        let one = {
            let app = app.clone();
            tokio::spawn(async move { post(&app, "/v1/chat/completions", &body(true, json!({})), &[]).await })
        };
        waiting(&app, 4).await;
        served.gate.store(true, Ordering::Release);
        for (task, n) in [(three, 3), (one, 1)] {
            let (status, text) = task.await.unwrap();
            assert_eq!(status, StatusCode::OK, "{text}");
            let r: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(r["choices"].as_array().unwrap().len(), n, "{text}");
        }
        // The places came back: four choices fit again.
        let r = ok(&app, "/v1/completions", &body(false, json!({"n": 4}))).await;
        assert_eq!(r["choices"].as_array().unwrap().len(), 4, "{r}");
    });
}
