//! nuvec-server: an OpenAI-compatible HTTP server over nuvec-lm's continuous-batching
//! [`Batcher`](nuvec_lm::Batcher), as `nuvec serve` runs it.
//!
//! Endpoints: `POST /v1/chat/completions` and `POST /v1/completions` (streaming as server-sent
//! events in OpenAI's chunk shape, ending with `data: [DONE]`, or whole; `n` choices, each a
//! Batcher request of its own, seeded seed + i when the request has a seed), OpenAI's Responses API
//! `POST /v1/responses` (output items, typed stream events; no stored state) and Anthropic's
//! Messages API `POST /v1/messages` and `/v1/messages/count_tokens` (content blocks, Anthropic's
//! stream events and error shape, the key also as `x-api-key`) over the same requests, `GET /v1/models`,
//! `GET /v1/models/{id}`, vLLM's `POST /tokenize` and `POST /detokenize`, `GET /health`, and
//! `GET /metrics` (Prometheus' text format: queue and cache gauges, token and prefix-cache
//! counters, finish reasons, time-to-first-token and inter-token histograms). Errors are
//! OpenAI's error objects (`{"error": {"message", "type", "param", "code"}}`) with their
//! status; a request whose choices find fewer than that many of [`ServerConfig::max_queue`]
//! places free gets 429.
//! `GET /` is a chat page (HTML, CSS and JavaScript from `page/`, built into the binary; open
//! without a key, its own `/v1` requests sending the key it is given): answers streamed and
//! rendered as Markdown by an escaping renderer, Stop (the request is cancelled), reasoning
//! folded, sampler settings, the conversation kept in the browser's localStorage.
//!
//! The shape: one engine thread owns the model and its Batcher ([`EngineLoop`]); each HTTP
//! handler (the Responses and Messages ones after translating their body into a chat
//! completions body) checks and tokenizes its request, hands it to the engine over a channel and reads the
//! request's tokens back over a channel of its own, turning them into text with
//! [`TextStream`](nuvec_lm::TextStream) (stop strings cut, held back while they may still
//! match); a chat answer's text then goes through nuvec-lm's
//! [`ChatOutput`](nuvec_lm::chat::ChatOutput), which splits off its reasoning
//! (`reasoning_content`) and parses its tool calls (`tool_calls`) in the chat template's format
//! (Hermes/Qwen, Llama 3, Mistral, gpt-oss harmony), holding back text that may still be markup.
//! The engine steps while any request is in flight and blocks when none is; a request
//! whose client went away is cancelled at the next step. A request that fails fails alone; a
//! step that fails as a whole stops the engine, and `/health` then answers 503. This crate
//! knows requests and events, never arrays.
//!
//! ```no_run
//! use nuvec_server::{Server, ServerConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (model, tokenizer) = nuvec_lm::load("mlx-community/Qwen3-0.6B-4bit")?;
//! let config = ServerConfig::new("Qwen3-0.6B-4bit", &tokenizer);
//! let server = Server::start(model, tokenizer, Default::default(), config)?;
//! server.run("127.0.0.1", 8080)?; // until ctrl-c or SIGTERM
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod answer;
mod api;
mod choice;
mod completions;
mod engine;
mod error;
mod generation;
mod messages;
mod metrics;
mod page;
mod params;
mod prepare;
mod responses;
mod structured;
mod tokenize;
mod tools;

use std::future::Future;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use nuvec_lm::{Batcher, BatcherOptions, GenerateOptions, Model, Tokenizer};
use serde_json::{Map, Value};

pub use engine::{EngineCore, EngineLoop, EngineStats};
pub use error::{ApiError, Error};

/// Request bodies larger than this are refused with 413 by default (16 MiB).
pub const DEFAULT_BODY_LIMIT: usize = 16 << 20;

/// Requests that may wait for admission by default; more get 429.
pub const DEFAULT_MAX_QUEUE: usize = 256;

/// How long a shutting-down server lets its requests finish by default: inside the 30 seconds
/// that service managers (systemd's default stop timeout is longer; Kubernetes' grace period is
/// 30 s) allow before they kill the process.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// How a server answers: the model's id, the defaults requests start from, and access.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The id `/v1/models` lists; a request naming another model gets 404 (one naming none is
    /// served).
    pub model_id: String,
    /// What a request that sets nothing gets: `max_tokens`, the sampler, the prefill step, the
    /// end-of-sequence ids. Each request's fields replace these.
    pub defaults: GenerateOptions,
    /// Extra arguments for the chat template (`enable_thinking`...), under each request's own
    /// `chat_template_kwargs`.
    pub template_args: Map<String, Value>,
    /// When set, `/v1` requires `Authorization: Bearer <key>` (401 otherwise); `/health` is open.
    pub api_key: Option<String>,
    /// Origins allowed by CORS (`*` for any); empty turns CORS off.
    pub allowed_origins: Vec<String>,
    /// The largest request body taken, in bytes (413 above).
    pub body_limit: usize,
    /// Most requests handed to the engine and not yet admitted to its batch, each choice of a
    /// request counted (a request of `n` above this is a 400); one more gets 429
    /// (`rate_limit_exceeded`, with `Retry-After`), so a flood queues boundedly instead of
    /// growing memory and latency without end.
    pub max_queue: usize,
    /// After ctrl-c or SIGTERM the server takes no new connections and lets the requests in
    /// flight finish for this long; those still running then end with an error (a stream gets
    /// an error object before `[DONE]`, a whole response a 500 saying the server shut down). A
    /// second signal ends them at once.
    pub shutdown_grace: Duration,
}

impl ServerConfig {
    /// A config serving `model_id` with the library's generation defaults and `tokenizer`'s
    /// end-of-sequence tokens; no key, no CORS, [`DEFAULT_BODY_LIMIT`], [`DEFAULT_MAX_QUEUE`].
    pub fn new(model_id: &str, tokenizer: &Tokenizer) -> Self {
        ServerConfig {
            model_id: model_id.to_string(),
            defaults: GenerateOptions {
                extra_eos_token_ids: tokenizer.eos_token_ids().to_vec(),
                ..GenerateOptions::default()
            },
            template_args: Map::new(),
            api_key: None,
            allowed_origins: vec![],
            body_limit: DEFAULT_BODY_LIMIT,
            max_queue: DEFAULT_MAX_QUEUE,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }
}

/// What the handlers need to know about the model (they never touch it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// Its vocabulary size (token ids and `logit_bias` keys are checked against it).
    pub vocab_size: usize,
    /// Its context in positions, if bounded (a longer prompt is a 400).
    pub context_length: Option<usize>,
    /// Its served adapters ([`Model::adapter_names`]): a request whose `model` names one runs
    /// with it, and `/v1/models` lists them beside the base model.
    pub adapters: Vec<String>,
}

impl ModelInfo {
    /// `model`'s.
    pub fn of(model: &Model) -> Self {
        let adapters = model.adapter_names().to_vec();
        ModelInfo { vocab_size: model.vocab_size(), context_length: model.context_length(), adapters }
    }

    /// The served adapter a request's `model` names: `Ok(None)` for the base model (`served`)
    /// or no name, a 404 for a name that is neither.
    pub(crate) fn adapter_named(&self, asked: Option<&str>, served: &str) -> Result<Option<String>, ApiError> {
        match asked {
            None => Ok(None),
            Some(m) if m == served => Ok(None),
            Some(m) if self.adapters.iter().any(|a| a == m) => Ok(Some(m.to_string())),
            Some(m) => Err(ApiError::no_model(m, served, &self.adapters)),
        }
    }
}

/// What every handler shares.
pub(crate) struct AppState {
    pub config: ServerConfig,
    pub info: ModelInfo,
    pub tokenizer: Arc<Tokenizer>,
    /// Each request's submissions, one per choice, sent together.
    pub engine: mpsc::Sender<Vec<engine::Submission>>,
    pub shared: Arc<engine::Shared>,
    /// When the server started (the model's `created`).
    pub created: u64,
    /// Structured outputs' grammars, compiled once per constraint.
    pub grammars: structured::Grammars,
}

/// Where a speculating request's guesses come from.
enum Guesses {
    /// Prompt lookup (when `BatcherOptions::speculation` is set at all).
    Lookup,
    /// A draft model.
    Draft(Model),
    /// The model's multi-token-prediction head.
    Mtp,
}

/// A server: its engine thread running, ready to be served on a socket.
pub struct Server {
    state: Arc<AppState>,
    engine: Option<JoinHandle<nuvec_lm::Result<()>>>,
}

impl Server {
    /// Starts the engine thread for `model` with a [`Batcher`] of `batcher` options (the cache
    /// is sized now, so a setting that cannot work fails here, not at the first request).
    pub fn start(
        model: Model,
        tokenizer: Tokenizer,
        batcher: BatcherOptions,
        config: ServerConfig,
    ) -> Result<Self, Error> {
        Self::start_batcher(model, Guesses::Lookup, tokenizer, batcher, config)
    }

    /// [`Server::start`] with `draft` guessing for the speculating requests
    /// ([`Batcher::with_draft`]; `batcher.speculation` must be set).
    pub fn start_with_draft(
        model: Model,
        draft: Model,
        tokenizer: Tokenizer,
        batcher: BatcherOptions,
        config: ServerConfig,
    ) -> Result<Self, Error> {
        Self::start_batcher(model, Guesses::Draft(draft), tokenizer, batcher, config)
    }

    /// [`Server::start`] with the model's multi-token-prediction head guessing for the
    /// speculating requests ([`Batcher::with_mtp`]; `batcher.speculation` must be set, the model
    /// loaded with its head).
    pub fn start_with_mtp(
        model: Model,
        tokenizer: Tokenizer,
        batcher: BatcherOptions,
        config: ServerConfig,
    ) -> Result<Self, Error> {
        Self::start_batcher(model, Guesses::Mtp, tokenizer, batcher, config)
    }

    fn start_batcher(
        model: Model,
        guesses: Guesses,
        tokenizer: Tokenizer,
        batcher: BatcherOptions,
        config: ServerConfig,
    ) -> Result<Self, Error> {
        let info = ModelInfo::of(&model);
        Self::with_engine(tokenizer, info, config, move |engine| {
            let batcher = match &guesses {
                Guesses::Draft(d) => Batcher::with_draft(&model, d, batcher)?,
                Guesses::Mtp => Batcher::with_mtp(&model, batcher)?,
                Guesses::Lookup => Batcher::new(&model, batcher)?,
            };
            engine.run(batcher);
            Ok(())
        })
    }

    /// Starts the engine thread running `engine`, which must call [`EngineLoop::run`] with its
    /// core (or return the error that kept it from making one). [`Server::start`] runs the
    /// Batcher this way; tests run other cores.
    pub fn with_engine<F>(tokenizer: Tokenizer, info: ModelInfo, config: ServerConfig, engine: F) -> Result<Self, Error>
    where
        F: FnOnce(EngineLoop) -> nuvec_lm::Result<()> + Send + 'static,
    {
        if config.body_limit == 0 {
            return Err(Error::Invalid("the body limit is 0 bytes: every request would be refused".into()));
        }
        if config.max_queue == 0 {
            return Err(Error::Invalid("the queue limit is 0 requests: every request would get 429".into()));
        }
        if config.model_id.is_empty() {
            return Err(Error::Invalid("the model id is empty: name the served model".into()));
        }
        if info.adapters.contains(&config.model_id) {
            return Err(Error::Invalid(format!(
                "a served adapter is named {:?}, as the model is: give it another name",
                config.model_id
            )));
        }
        config.defaults.validate().map_err(Error::Runtime)?;
        let (submit, submissions) = mpsc::channel();
        let (ready, started) = mpsc::channel();
        let shared = Arc::new(engine::Shared::default());
        let lp = EngineLoop { submissions, shared: shared.clone(), ready: Some(ready) };
        let handle = std::thread::Builder::new()
            .name("nuvec-engine".into())
            .spawn(move || engine(lp))
            .map_err(|e| Error::Io { what: "starting the engine thread".into(), source: e })?;
        if started.recv().is_err() {
            // The thread ended without serving: its error says why.
            return Err(match handle.join() {
                Ok(Err(e)) => Error::Runtime(e),
                Ok(Ok(())) => Error::Engine("the engine returned without running".into()),
                Err(panic) => Error::Engine(format!("it panicked: {}", engine::panic_text(&panic))),
            });
        }
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let tokenizer = Arc::new(tokenizer);
        let grammars = structured::Grammars::new(tokenizer.clone());
        let state = Arc::new(AppState { config, info, tokenizer, engine: submit, shared, created, grammars });
        Ok(Server { state, engine: Some(handle) })
    }

    /// The HTTP routes, for serving on a listener of the caller's (or calling in tests).
    pub fn router(&self) -> axum::Router {
        api::router(self.state.clone())
    }

    /// The engine's counts (as `/health` reports them).
    pub fn stats(&self) -> EngineStats {
        self.state.shared.stats()
    }

    /// Serves on `listener` until `shutdown` completes; then takes no new connections, lets
    /// the requests in flight finish for [`ServerConfig::shutdown_grace`] (or until `abort`
    /// completes, if sooner), ends those still running with an error, and waits for the engine
    /// thread to finish.
    pub async fn serve(
        mut self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
        abort: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let shared = self.state.shared.clone();
        let grace = self.state.config.shutdown_grace;
        let draining = async move {
            shutdown.await;
            eprintln!("[INFO] shutting down: finishing the requests in flight (at most {grace:?})");
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(grace) => {},
                    _ = abort => {},
                }
                if shared.stats().running + shared.stats().waiting > 0 {
                    eprintln!("[WARN] ending the requests still in flight with an error");
                }
                shared.abort_all();
            });
        };
        let served = axum::serve(listener, self.router()).with_graceful_shutdown(draining).await;
        served.map_err(|e| Error::Io { what: "serving HTTP".into(), source: e })?;
        let handle = self.engine.take();
        drop(self); // the last sender: the engine thread ends once idle
        if let Some(handle) = handle {
            let joined = tokio::task::spawn_blocking(move || handle.join()).await;
            if let Ok(Ok(Err(e))) = joined {
                return Err(Error::Runtime(e));
            }
        }
        Ok(())
    }

    /// Binds `host:port` (port 0 takes a free one), prints `listening on http://ADDR` to
    /// stderr, and serves until ctrl-c or SIGTERM, on a runtime of its own.
    pub fn run(self, host: &str, port: u16) -> Result<(), Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("nuvec-http")
            .build()
            .map_err(|e| Error::Io { what: "starting the async runtime".into(), source: e })?;
        runtime.block_on(async move {
            let what = || format!("binding {host}:{port}");
            let listener =
                tokio::net::TcpListener::bind((host, port)).await.map_err(|e| Error::Io { what: what(), source: e })?;
            let addr = listener.local_addr().map_err(|e| Error::Io { what: what(), source: e })?;
            let mut signals = StopSignals::new()?;
            eprintln!("[INFO] listening on http://{addr}");
            // The first signal starts the shutdown; a second one ends the requests at once.
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let (abort, aborted) = tokio::sync::oneshot::channel::<()>();
            let signals = tokio::spawn(async move {
                signals.next().await;
                let _ = stop.send(());
                signals.next().await;
                let _ = abort.send(());
            });
            let stopped = async move {
                let _ = stopped.await;
            };
            let aborted = async move {
                let _ = aborted.await;
            };
            let result = self.serve(listener, stopped, aborted).await;
            signals.abort();
            result?;
            eprintln!("[INFO] shut down");
            Ok(())
        })
    }
}

/// The signals that stop the server (ctrl-c and SIGTERM), listened for from the moment this is
/// made: until then a signal has its default action, which kills the process, so the server makes
/// it before it says it is listening.
struct StopSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Inside the runtime.
    fn new() -> Result<Self, Error> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind: SignalKind, name: &str| {
                signal(kind).map_err(|e| Error::Io { what: format!("listening for {name}"), source: e })
            };
            Ok(StopSignals {
                interrupt: listen(SignalKind::interrupt(), "ctrl-c")?,
                terminate: listen(SignalKind::terminate(), "SIGTERM")?,
            })
        }
        #[cfg(not(unix))]
        Ok(StopSignals {})
    }

    /// Resolves at the next ctrl-c or SIGTERM.
    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {},
            _ = self.terminate.recv() => {},
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
