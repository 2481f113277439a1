//! The routes (each protocol's handler lives in its own module: `completions`, `responses`,
//! `messages`), the API key, CORS, the models list, `/health` and `/metrics`, and the errors for
//! unknown routes, wrong methods, oversized bodies and panics.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};

use crate::engine::panic_text;
use crate::error::ApiError;
use crate::generation::fresh_id;
use crate::params::Kind;
use crate::{completions, messages, metrics as prometheus, responses, tokenize, AppState};

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
        .route("/responses", post(responses::create))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    // Anthropic's clients send their key as x-api-key and read errors in Anthropic's shape.
    let anthropic = Router::new()
        .route("/messages", post(messages::create))
        .route("/messages/count_tokens", post(messages::count_tokens))
        .route_layer(middleware::from_fn_with_state(state.clone(), messages::authorize));
    let v1 = v1.merge(anthropic);
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

async fn no_route(method: Method, uri: Uri) -> Response {
    in_shape_of(&uri, ApiError::no_route(method.as_str(), uri.path()))
}

async fn wrong_method(method: Method, uri: Uri) -> Response {
    let error = ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        code: Some("method_not_allowed"),
        ..ApiError::no_route(method.as_str(), uri.path())
    };
    in_shape_of(&uri, error)
}

/// `error` in the shape the clients of `uri` read: Anthropic's under `/v1/messages`, OpenAI's
/// elsewhere.
fn in_shape_of(uri: &Uri, error: ApiError) -> Response {
    match uri.path().strip_prefix("/v1/messages") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => messages::error_response(error),
        _ => error.into_response(),
    }
}

/// `Authorization: Bearer <key>` on every `/v1` route when the server has a key.
async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Err(message) = check_key(&state, request.headers(), false) {
        let error = ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        };
        return error.into_response();
    }
    next.run(request).await
}

/// Whether `headers` carry the server's key (if it has one) as `Authorization: Bearer <key>`
/// or, with `x_api_key`, as `x-api-key: <key>` (Anthropic's clients send that); the 401's
/// message when not.
pub(crate) fn check_key(state: &AppState, headers: &HeaderMap, x_api_key: bool) -> Result<(), &'static str> {
    let Some(key) = &state.config.api_key else { return Ok(()) };
    let text = |name| headers.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    let bearer = text(header::AUTHORIZATION)
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let given = match (bearer, x_api_key) {
        (Some(b), _) => Some(b),
        (None, true) => text(header::HeaderName::from_static("x-api-key")).map(str::trim),
        (None, false) => None,
    };
    match given {
        Some(g) if same(g.as_bytes(), key.as_bytes()) => Ok(()),
        Some(_) => Err("Incorrect API key provided"),
        None if x_api_key => {
            Err("Missing API key: send it as the header `x-api-key: <key>` or `Authorization: Bearer <key>`")
        }
        None => Err("Missing API key: send it as the header `Authorization: Bearer <key>`"),
    }
}

/// Equality that takes as long whichever byte differs.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(crate) fn now() -> u64 {
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

/// The model card of `id`: the base model, or a served adapter (with the base as its `parent`,
/// as vLLM lists LoRA modules).
fn model_object(state: &AppState, id: &str) -> Value {
    let mut card = json!({"id": id, "object": "model", "created": state.created, "owned_by": "nuvec"});
    if id != state.config.model_id {
        card["parent"] = state.config.model_id.clone().into();
    }
    card
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    let ids = std::iter::once(&state.config.model_id).chain(&state.info.adapters);
    Json(json!({"object": "list", "data": ids.map(|id| model_object(&state, id)).collect::<Vec<_>>()}))
}

async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    state.info.adapter_named(Some(&id), &state.config.model_id)?;
    Ok(Json(model_object(&state, &id)))
}

async fn chat_completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    with_id(state, Kind::Chat, body).await
}

async fn completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    with_id(state, Kind::Completion, body).await
}

async fn with_id(state: Arc<AppState>, kind: Kind, body: Result<Bytes, BytesRejection>) -> Response {
    let id = fresh_id(match kind {
        Kind::Chat => "chatcmpl-",
        Kind::Completion => "cmpl-",
    });
    let response = completions::complete(state, kind, body, &id).await.unwrap_or_else(IntoResponse::into_response);
    tagged(response, &id)
}

/// Every generation response, errors included, names its request in `x-request-id`; a 429
/// says when to retry.
pub(crate) fn tagged(mut response: Response, id: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(id) {
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
