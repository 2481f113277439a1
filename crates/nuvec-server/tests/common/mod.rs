//! The scripted engine the tool and protocol tests share: a core that answers every request
//! with fixed token streams (encoded from text by the served tokenizer), over real tokenizers
//! and chat templates (the oracle's tool_chats fixtures), so no model runs.
#![allow(dead_code)] // each test binary uses its part

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use nuvec_lm::{BatcherStats, Event, FinishReason, GenerateOptions, RequestId, Tokenizer};
use nuvec_server::{EngineCore, ModelInfo, Server, ServerConfig};
use serde_json::Value;
use tower::ServiceExt;

pub fn fixture(name: &str) -> PathBuf {
    let root =
        std::env::var("NUVEC_FIXTURES").unwrap_or_else(|_| panic!("NUVEC_FIXTURES is not set: run scripts/test.sh"));
    let dir = PathBuf::from(root).join("tool_chats").join(name);
    assert!(dir.join("chats.json").exists(), "{}: missing; run scripts/setup-oracle.sh", dir.display());
    dir
}

/// Gives the answer (token ids) to a prompt.
pub type Answerer = Arc<dyn Fn(&Tokenizer, &[u32]) -> Vec<u32> + Send + Sync>;

/// A core that answers each request with its answerer's tokens, one per step, then ends it
/// (end of sequence, or the length limit when max_tokens cuts it); it keeps every prompt.
pub struct Scripted {
    tokenizer: Tokenizer,
    answer: Answerer,
    prompts: Arc<Mutex<Vec<Vec<u32>>>>,
    next: u64,
    live: Vec<(RequestId, VecDeque<u32>, bool)>,
}

impl EngineCore for Scripted {
    fn submit(&mut self, prompt: Vec<u32>, options: GenerateOptions) -> nuvec_lm::Result<RequestId> {
        let id = RequestId(self.next);
        self.next += 1;
        let mut tokens: VecDeque<u32> = (self.answer)(&self.tokenizer, &prompt).into();
        let cut = tokens.len() > options.max_tokens;
        tokens.truncate(options.max_tokens);
        self.prompts.lock().unwrap().push(prompt);
        self.live.push((id, tokens, cut));
        Ok(id)
    }

    fn step(&mut self) -> nuvec_lm::Result<Vec<Event>> {
        let mut events = vec![];
        for (id, tokens, cut) in &mut self.live {
            if let Some(token) = tokens.pop_front() {
                events.push(Event::Token { id: *id, token });
            }
            if tokens.is_empty() {
                let reason = if *cut { FinishReason::Length } else { FinishReason::EndOfSequence };
                events.push(Event::Finished { id: *id, reason });
            }
        }
        self.live.retain(|(_, tokens, _)| !tokens.is_empty());
        Ok(events)
    }

    fn is_busy(&self) -> bool {
        !self.live.is_empty()
    }

    fn cancel(&mut self, _id: RequestId) -> bool {
        false
    }

    fn stats(&self) -> BatcherStats {
        BatcherStats { running: self.live.len(), ..Default::default() }
    }
}

pub struct Served {
    pub server: Server,
    pub tokenizer: Tokenizer,
    pub prompts: Arc<Mutex<Vec<Vec<u32>>>>,
}

impl Served {
    pub fn last_prompt(&self) -> Vec<u32> {
        self.prompts.lock().unwrap().last().cloned().expect("a prompt was submitted")
    }
}

pub fn serve(dir: &std::path::Path, answer: Answerer) -> Served {
    serve_keyed(dir, answer, None)
}

/// As [`serve`], requiring `key` when one is given.
pub fn serve_keyed(dir: &std::path::Path, answer: Answerer, key: Option<&str>) -> Served {
    let tokenizer = Tokenizer::load(dir, &[]).unwrap();
    let mut config = ServerConfig::new("scripted", &tokenizer);
    config.api_key = key.map(str::to_string);
    let info = ModelInfo { vocab_size: tokenizer.vocab_size(), context_length: None, adapters: vec![] };
    let prompts = Arc::new(Mutex::new(vec![]));
    let core = Scripted { tokenizer: tokenizer.clone(), answer, prompts: prompts.clone(), next: 0, live: vec![] };
    let server = Server::with_engine(tokenizer.clone(), info, config, move |engine| {
        engine.run(core);
        Ok(())
    })
    .unwrap();
    Served { server, tokenizer, prompts }
}

/// An answerer that always says `text`.
pub fn says(text: &'static str) -> Answerer {
    Arc::new(move |tokenizer: &Tokenizer, _: &[u32]| tokenizer.encode(text, false).unwrap())
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// POSTs `body` to `path` with extra `headers`: (status, body text).
pub async fn post(app: &axum::Router, path: &str, body: &Value, headers: &[(&str, &str)]) -> (StatusCode, String) {
    let mut request = Request::builder().method("POST").uri(path).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app.clone().oneshot(request.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}
