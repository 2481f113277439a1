//! The routes: OpenAI's completions, chat completions and models, and `/health`; their
//! responses and stream chunks in OpenAI's shapes.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use nuvec_lm::chat::{ChatOutput, ToolFormat};
use nuvec_lm::token_bytes::TokenBytes;
use nuvec_lm::{FinishReason, TextStream, TokenLogprobs};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc as tmpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};

use crate::answer::ChatAnswer;
use crate::engine::{panic_text, Output, Submission};
use crate::error::ApiError;
use crate::params::{self, Kind, Parsed, Prompt};
use crate::tools::ToolChoice;
use crate::{metrics as prometheus, tokenize, AppState};

/// The router over `state`: `/v1`, `/tokenize` and `/detokenize` (behind the API key when one
/// is set), `/health` and `/metrics` (open, for monitors), the chat page at `/` (open: it asks
/// its user for the key), and OpenAI errors for unknown routes,
/// wrong methods, oversized bodies and panics.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/chat/completions", post(chat_completions))
        .route("/completions", post(completions))
        .route("/models", get(models))
        .route("/models/{*model}", get(model))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    // vLLM's tokenizer routes sit beside /v1; they read prompts, so the key guards them too.
    let tokens = Router::new()
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    let mut app = Router::new()
        .nest("/v1", v1)
        .merge(tokens)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(crate::page::routes())
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::extract::DefaultBodyLimit::max(state.config.body_limit))
        .layer(CatchPanicLayer::custom(panicked));
    if let Some(cors) = cors(&state.config.allowed_origins) {
        app = app.layer(cors);
    }
    app.with_state(state)
}

fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::from(Any)
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(CorsLayer::new().allow_origin(allow).allow_methods(Any).allow_headers(Any).expose_headers(Any))
}

fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let text = panic_text(&panic);
    eprintln!("[ERROR] a request handler panicked: {text}");
    ApiError::internal("(handler)", format!("the handler panicked: {text}")).into_response()
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        code: Some("method_not_allowed"),
        ..ApiError::no_route(method.as_str(), uri.path())
    }
}

/// `Authorization: Bearer <key>` on every `/v1` route when the server has a key.
async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim);
        let message = match given {
            Some(g) if same(g.as_bytes(), key.as_bytes()) => None,
            Some(_) => Some("Incorrect API key provided"),
            None => Some("Missing API key: send it as the header `Authorization: Bearer <key>`"),
        };
        if let Some(message) = message {
            let error = ApiError {
                status: StatusCode::UNAUTHORIZED,
                message: message.into(),
                kind: "invalid_request_error",
                param: None,
                code: Some("invalid_api_key"),
            };
            return error.into_response();
        }
    }
    next.run(request).await
}

/// Equality that takes as long whichever byte differs.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let stats = state.shared.stats();
    let requests = json!({
        "waiting": stats.waiting,
        "running": stats.running,
        "completed": stats.completed,
        "cancelled": stats.cancelled,
        "failed": stats.failed,
        "generated_tokens": stats.generated_tokens,
    });
    match state.shared.failure() {
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "error", "error": why, "model": state.config.model_id, "requests": requests})),
        )
            .into_response(),
        None => Json(json!({"status": "ok", "model": state.config.model_id, "requests": requests})).into_response(),
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let stats = state.shared.stats();
    let metrics = state.shared.metrics().clone();
    let rejected = state.shared.rejected.load(Ordering::Relaxed);
    let text = prometheus::render(&state.config.model_id, &metrics, &stats, rejected);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

fn model_object(state: &AppState) -> Value {
    json!({"id": state.config.model_id, "object": "model", "created": state.created, "owned_by": "nuvec"})
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&state)]}))
}

async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    match id == state.config.model_id {
        true => Ok(Json(model_object(&state))),
        false => Err(ApiError::no_model(&id, &state.config.model_id)),
    }
}

async fn chat_completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    with_id(state, Kind::Chat, body).await
}

async fn completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    with_id(state, Kind::Completion, body).await
}

/// Every completion response, errors included, names its request in `x-request-id`.
async fn with_id(state: Arc<AppState>, kind: Kind, body: Result<Bytes, BytesRejection>) -> Response {
    let id = request_id(kind);
    let mut response = complete(state, kind, body, &id).await.unwrap_or_else(IntoResponse::into_response);
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(header::HeaderName::from_static("x-request-id"), value);
    }
    if response.status() == StatusCode::TOO_MANY_REQUESTS {
        // The queue drains in about a request's time; clients back off by this much.
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// A request body as a JSON object, or the 400 (413) that says why it is not one.
pub(crate) fn json_object(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Map<String, Value>, ApiError> {
    let bytes = body.map_err(|r| body_error(r, limit))?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| ApiError {
        code: Some("invalid_json"),
        ..ApiError::bad_request(format!("the body is not valid JSON: {e}"))
    })?;
    match value {
        Value::Object(body) => Ok(body),
        _ => Err(ApiError::bad_request("the body must be a JSON object")),
    }
}

fn body_error(rejection: BytesRejection, limit: usize) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is larger than this server's limit of {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        };
    }
    ApiError { status: rejection.status(), ..ApiError::bad_request(format!("the body could not be read: {rejection}")) }
}

/// A fresh id: `chatcmpl-…` or `cmpl-…`, unique within the process and unlikely across them.
fn request_id(kind: Kind) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    format!("{prefix}-{:016x}", h.finish())
}

/// A request checked and tokenized, ready for the engine.
struct Prepared {
    parsed: Parsed,
    ids: Vec<u32>,
    /// A chat request's answer reader.
    answer: Option<ChatAnswer>,
}

/// The chat prompt for `messages`, and the reader of its answer: tools shown to the model are
/// parsed back out of it in the template's format, and tool_choice "required" or a named
/// function starts the answer inside a call (the call's opening is appended to the prompt and
/// read first), since the model cannot be constrained to one otherwise.
fn chat_prompt(
    state: &AppState,
    parsed: &Parsed,
    messages: &Value,
    args: &Map<String, Value>,
) -> Result<(String, ChatAnswer), ApiError> {
    let tokenizer = &state.tokenizer;
    let template = tokenizer.chat_template().ok_or_else(|| {
        ApiError::invalid("messages", "this model has no chat template: use /v1/completions with a prompt")
    })?;
    let ctx = tokenizer.template_context(args.clone());
    let mut text = template
        .render_values(messages, true, false, &ctx)
        .map_err(|e| ApiError::invalid("messages", format!("the chat template failed on these messages: {e}")))?;
    let format = ToolFormat::of_template(template.source());
    let tools = parsed.tools.as_ref().filter(|t| t.parses_calls());
    if tools.is_some() && format.is_none() {
        return Err(ApiError::unsupported(
            "tools",
            format!(
                "the chat template ({}) writes no tool calls in a format this server reads (Hermes/Qwen <tool_call>, \
                 Llama 3 JSON, Mistral [TOOL_CALLS], gpt-oss harmony): serve a checkpoint whose template supports \
                 tools, or send no tools",
                template.origin()
            ),
        ));
    }
    let prefix = match (tools.map(|t| &t.choice), format) {
        (Some(ToolChoice::Required), Some(f)) => f.forced_prefix(None),
        (Some(ToolChoice::Named(name)), Some(f)) => f.forced_prefix(Some(name)),
        _ => String::new(),
    };
    text.push_str(&prefix);
    let mut output = ChatOutput::new(template, &text, format, tools.is_some());
    // The opening is inside a call: nothing of it is final yet.
    let held = output.push(&prefix);
    debug_assert!(held.is_empty(), "a forced call's opening gave {held:?}");
    Ok((text, ChatAnswer::new(output, format)))
}

/// Parses, renders the chat template and encodes (on a blocking thread: templates and
/// tokenizers are CPU work).
fn prepare(state: &AppState, kind: Kind, body: &Map<String, Value>) -> Result<Prepared, ApiError> {
    let tokenizer = &state.tokenizer;
    let cx = params::Context {
        model_id: &state.config.model_id,
        defaults: &state.config.defaults,
        template_args: &state.config.template_args,
        vocab_size: state.info.vocab_size,
        tokenizer,
    };
    let parsed = params::parse(kind, body, &cx)?;
    let mut answer = None;
    let (ids, param) = match &parsed.prompt {
        Prompt::Messages(messages, args) => {
            let (text, reader) = chat_prompt(state, &parsed, messages, args)?;
            answer = Some(reader);
            // The template wrote the special tokens.
            (tokenizer.encode(&text, false), "messages")
        }
        Prompt::Text(text) => (tokenizer.encode(text, true), "prompt"),
        Prompt::Tokens(ids) => (Ok(ids.clone()), "prompt"),
    };
    let ids = ids.map_err(|e| ApiError::invalid(param, format!("the prompt could not be tokenized: {e}")))?;
    if ids.is_empty() {
        return Err(ApiError::invalid(param, "the prompt is empty: it encodes to no tokens"));
    }
    let limit = match parsed.options.context_length {
        Some(n) => Some(n),
        None if parsed.options.allow_past_context => None,
        None => state.info.context_length,
    };
    if let Some(limit) = limit.filter(|&l| ids.len() >= l) {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(
                param,
                format!(
                    "This model's maximum context length is {limit} tokens, and the prompt is {} tokens, which \
                     leaves no room for an answer; shorten the prompt",
                    ids.len()
                ),
            )
        });
    }
    Ok(Prepared { parsed, ids, answer })
}

/// The runtime's refusal of a request: bad input is a 400, anything else a 500.
fn refused(request_id: &str, error: nuvec_lm::Error) -> ApiError {
    match error {
        nuvec_lm::Error::Invalid(message) => ApiError::bad_request(message),
        nuvec_lm::Error::Unsupported(message) => ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::bad_request(format!("not supported: {message}"))
        },
        other => {
            eprintln!("[ERROR] request {request_id} was refused: {other}");
            ApiError::internal(request_id, other)
        }
    }
}

fn engine_gone(state: &AppState) -> ApiError {
    ApiError::unavailable(&state.shared.failure().unwrap_or_else(|| "the engine has stopped".into()))
}

async fn complete(
    state: Arc<AppState>,
    kind: Kind,
    body: Result<Bytes, BytesRejection>,
    id: &str,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = json_object(body, state.config.body_limit)?;
    if state.shared.failure().is_some() {
        return Err(engine_gone(&state));
    }
    let prepared = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || prepare(&state, kind, &body))
            .await
            .map_err(|e| ApiError::internal(id, format!("preparing the prompt failed: {e}")))??
    };
    let Prepared { parsed, ids, answer } = prepared;
    // After the checks, so a bad request hears what is wrong with it whatever the load.
    let max_queue = state.config.max_queue;
    let slot = state.shared.enqueue(max_queue).ok_or_else(|| ApiError::queue_full(max_queue))?;

    let (outputs, mut receiver) = tmpsc::unbounded_channel();
    let (accepted, was_accepted) = oneshot::channel();
    let submission = Submission {
        prompt: ids.clone(),
        options: parsed.options.clone(),
        outputs,
        accepted,
        request_id: id.into(),
        arrived,
        slot,
    };
    state.engine.send(submission).map_err(|_| engine_gone(&state))?;
    match was_accepted.await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return Err(refused(id, error)),
        Err(_) => return Err(engine_gone(&state)),
    }

    let mut text = TextStream::new(&state.tokenizer, &parsed.options);
    if kind == Kind::Chat {
        // The answer as mlx_lm.server and `nuvec generate` give it (a byte-level BPE answer's
        // first leading space dropped); a completion keeps it, so prompt + text is the whole.
        text = text.with_mlx_lm_spacing();
    }
    let mut reply = Reply {
        kind,
        id: id.into(),
        created: now(),
        model: state.config.model_id.clone(),
        text,
        table: state.tokenizer.token_bytes(),
        prompt_tokens: ids.len(),
        cached_tokens: 0,
        completion_tokens: 0,
        logprobs: parsed.options.logprobs.is_some(),
        pending: vec![],
        offset: 0,
        include_usage: parsed.include_usage,
        answer,
    };
    if !parsed.stream {
        let mut content = String::new();
        let mut failed = None;
        let reason = loop {
            match receiver.recv().await {
                Some(Output::Started { cached_tokens }) => reply.cached_tokens = cached_tokens,
                Some(Output::Token { token, logprobs }) => {
                    let piece = reply.token(token, logprobs);
                    match &mut reply.answer {
                        Some(answer) => answer.gather(&piece, false),
                        None => content.push_str(&piece),
                    }
                }
                Some(Output::Failed(message)) => failed = Some(message),
                Some(Output::Finished(reason)) => break reason,
                None => return Err(engine_gone(&state)),
            }
        };
        if let Some(message) = failed {
            return Err(ApiError::internal(id, message));
        }
        let rest = reply.text.finish();
        match &mut reply.answer {
            Some(answer) => answer.gather(&rest, true),
            None => content.push_str(&rest),
        }
        return Ok(Json(reply.whole(content, &reason)).into_response());
    }

    let (chunks, body) = tmpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let send = |value: Value| {
            let chunks = chunks.clone();
            async move { chunks.send(Ok(SseEvent::default().data(value.to_string()))).await.is_ok() }
        };
        if kind == Kind::Chat && !send(reply.chunk(json!({"role": "assistant", "content": ""}), None)).await {
            return;
        }
        let mut failed = None;
        loop {
            let output = tokio::select! {
                // The client left: dropping the receiver makes the engine cancel the request.
                _ = chunks.closed() => return,
                output = receiver.recv() => output,
            };
            match output {
                Some(Output::Started { cached_tokens }) => reply.cached_tokens = cached_tokens,
                Some(Output::Token { token, logprobs }) => {
                    let piece = reply.token(token, logprobs);
                    for chunk in reply.pieces(piece, false) {
                        if !send(chunk).await {
                            return;
                        }
                    }
                }
                Some(Output::Failed(message)) => failed = Some(message),
                Some(Output::Finished(reason)) => {
                    if let Some(message) = failed.take() {
                        let _ = send(ApiError::internal(&reply.id, message).body()).await;
                    } else {
                        let rest = reply.text.finish();
                        for chunk in reply.pieces(rest, true) {
                            if !send(chunk).await {
                                return;
                            }
                        }
                        let last = reply.piece(String::new(), Some(&reason));
                        if !send(last).await {
                            return;
                        }
                        if reply.include_usage && !send(reply.usage_chunk()).await {
                            return;
                        }
                    }
                    let _ = chunks.send(Ok(SseEvent::default().data("[DONE]"))).await;
                    return;
                }
                None => {
                    let why = "the engine stopped before the request finished";
                    let _ = send(ApiError::internal(&reply.id, why).body()).await;
                    let _ = chunks.send(Ok(SseEvent::default().data("[DONE]"))).await;
                    return;
                }
            }
        }
    });
    Ok(Sse::new(ReceiverStream::new(body)).into_response())
}

/// OpenAI's finish reason for `reason` ("tool_calls" when the answer `called` a tool and
/// ended without an error, as vLLM reports it even when a limit cut the text after the call).
fn finish_reason(reason: &FinishReason, called: bool) -> &'static str {
    match reason {
        FinishReason::Error => "error",
        _ if called => "tool_calls",
        FinishReason::EndOfSequence | FinishReason::Stop(_) | FinishReason::Cancelled => "stop",
        // The KV cache ran out of room: cut short by a limit, as "length" says.
        FinishReason::Length | FinishReason::ContextLength(_) | FinishReason::CacheFull => "length",
    }
}

/// One request's answer as it is built: its text, counts and log-probabilities.
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    text: TextStream,
    table: Arc<TokenBytes>,
    prompt_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache.
    cached_tokens: usize,
    completion_tokens: usize,
    logprobs: bool,
    /// Log-probabilities of the tokens not yet sent.
    pending: Vec<TokenLogprobs>,
    /// Characters of the token strings sent so far (a completion's `text_offset`).
    offset: usize,
    include_usage: bool,
    /// A chat answer's reader (None for a completion).
    answer: Option<ChatAnswer>,
}

/// OpenAI's floor for a log-probability that is not finite.
fn finite(lp: f32) -> f64 {
    if lp.is_finite() {
        lp as f64
    } else {
        -9999.0
    }
}

impl Reply {
    /// Takes a token: returns the text that is now final.
    fn token(&mut self, token: u32, logprobs: Option<TokenLogprobs>) -> String {
        self.completion_tokens += 1;
        if let Some(lp) = logprobs.filter(|_| self.logprobs) {
            self.pending.push(lp);
        }
        self.text.push(token)
    }

    fn token_text(&self, id: u32) -> (String, &[u8]) {
        let bytes = self.table.get(id);
        (String::from_utf8_lossy(bytes).into_owned(), bytes)
    }

    /// The log-probabilities of the pending tokens in this endpoint's shape (None when not
    /// asked, or in a stream chunk when no token is pending).
    fn take_logprobs(&mut self, streaming: bool) -> Option<Value> {
        if !self.logprobs || (streaming && self.pending.is_empty()) {
            return None;
        }
        let pending = std::mem::take(&mut self.pending);
        Some(match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = pending
                    .iter()
                    .map(|lp| {
                        let (token, bytes) = self.token_text(lp.token);
                        let top: Vec<Value> = lp
                            .top
                            .iter()
                            .map(|&(t, l)| {
                                let (token, bytes) = self.token_text(t);
                                json!({"token": token, "logprob": finite(l), "bytes": bytes})
                            })
                            .collect();
                        json!({"token": token, "logprob": finite(lp.logprob), "bytes": bytes, "top_logprobs": top})
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
            Kind::Completion => {
                let (mut tokens, mut values, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
                for lp in &pending {
                    let (token, _) = self.token_text(lp.token);
                    offsets.push(self.offset);
                    self.offset += token.chars().count();
                    tokens.push(token);
                    values.push(finite(lp.logprob));
                    let top: Map<String, Value> =
                        lp.top.iter().map(|&(t, l)| (self.token_text(t).0, json!(finite(l)))).collect();
                    tops.push(Value::Object(top));
                }
                json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
            }
        })
    }

    fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }

    fn object(&self, streaming: bool) -> &'static str {
        match (self.kind, streaming) {
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn called(&self) -> bool {
        self.answer.as_ref().is_some_and(ChatAnswer::called)
    }

    /// The chunks carrying `text` (with `end`, the answer's last text): a completion's text as
    /// it is, a chat answer's as its reader splits it (none while it holds text back).
    fn pieces(&mut self, text: String, end: bool) -> Vec<Value> {
        let deltas = match &mut self.answer {
            Some(answer) => answer.stream(&text, end),
            None if text.is_empty() => vec![],
            None => return vec![self.piece(text, None)],
        };
        deltas.into_iter().map(|d| self.chunk(d, None)).collect()
    }

    /// A stream chunk of one choice.
    fn chunk(&mut self, delta: Value, reason: Option<&FinishReason>) -> Value {
        let called = self.called();
        let finish = reason.map(|r| finish_reason(r, called));
        let logprobs = self.take_logprobs(true);
        let choice = match self.kind {
            Kind::Chat => json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
            Kind::Completion => json!({"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish}),
        };
        let mut chunk = json!({
            "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "choices": [choice],
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// A chunk carrying `text` (and a finish reason on the last).
    fn piece(&mut self, text: String, reason: Option<&FinishReason>) -> Value {
        match (self.kind, text.is_empty()) {
            (Kind::Chat, true) => self.chunk(json!({}), reason),
            (Kind::Chat, false) => self.chunk(json!({"content": text}), reason),
            (Kind::Completion, _) => self.chunk(Value::String(text), reason),
        }
    }

    /// The final chunk of `stream_options.include_usage`: no choices, the usage.
    fn usage_chunk(&self) -> Value {
        json!({
            "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "choices": [], "usage": self.usage(),
        })
    }

    /// The whole (non-streaming) response: a completion's `text`, or the chat answer's message.
    fn whole(&mut self, text: String, reason: &FinishReason) -> Value {
        let logprobs = self.take_logprobs(false);
        let finish = finish_reason(reason, self.called());
        let choice = match (&self.answer, self.kind) {
            (Some(answer), _) => json!({
                "index": 0, "message": answer.message(), "logprobs": logprobs, "finish_reason": finish,
            }),
            (None, Kind::Chat) => json!({
                "index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                "finish_reason": finish,
            }),
            (None, Kind::Completion) => {
                json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        json!({
            "id": self.id, "object": self.object(false), "created": self.created, "model": self.model,
            "choices": [choice], "usage": self.usage(),
        })
    }
}
