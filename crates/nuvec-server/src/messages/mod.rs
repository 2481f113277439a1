//! Anthropic's Messages API, `POST /v1/messages` (and `/v1/messages/count_tokens`), over the
//! same engine and answer reader as chat completions: the body is translated into a chat
//! completions body (`request.rs`), the answer's parts rendered as content blocks and
//! Anthropic's stream events (`output.rs`). Errors on these routes are in Anthropic's shape,
//! `{"type": "error", "error": {"type", "message"}}`, and the key may come as `x-api-key`.

mod output;
mod request;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::api::{check_key, json_object, tagged};
use crate::error::ApiError;
use crate::generation::{self, fresh_id};
use crate::params::Kind;
use crate::prepare::prepare;
use crate::AppState;

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// `error`'s body in Anthropic's shape.
pub(crate) fn error_body(error: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(error.status), "message": error.message}})
}

pub(crate) fn error_response(error: ApiError) -> Response {
    (error.status, Json(error_body(&error))).into_response()
}

/// The server's key as `x-api-key` or `Authorization: Bearer`, refused in Anthropic's shape.
pub(crate) async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match check_key(&state, request.headers(), true) {
        Ok(()) => next.run(request).await,
        Err(message) => error_response(ApiError { status: StatusCode::UNAUTHORIZED, ..ApiError::bad_request(message) }),
    }
}

/// `POST /v1/messages`.
pub(crate) async fn create(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let id = fresh_id("msg_");
    let response = respond(state, body, &id).await.unwrap_or_else(error_response);
    tagged(response, &id)
}

async fn respond(state: Arc<AppState>, body: Result<Bytes, BytesRejection>, id: &str) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = json_object(body, state.config.body_limit)?;
    let request = request::translate(&body, true)?;
    let prepared =
        prepare(&state, Kind::Chat, request.chat, id).await.map_err(|e| e.renamed("stop", "stop_sequences"))?;
    let rendering = output::Rendering::new(id, &state.config.model_id, request.stop_sequences);
    generation::run(state, prepared, rendering, id, arrived).await
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}`, the prompt the same body would give
/// (`max_tokens` may be left out).
pub(crate) async fn count_tokens(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let id = fresh_id("count_");
    let counted = async {
        let body = json_object(body, state.config.body_limit)?;
        let request = request::translate(&body, false)?;
        let prepared = prepare(&state, Kind::Chat, request.chat, &id).await?;
        Ok::<_, ApiError>(Json(json!({"input_tokens": prepared.ids.len()})).into_response())
    };
    counted.await.unwrap_or_else(error_response)
}
