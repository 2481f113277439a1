//! OpenAI's Responses API, `POST /v1/responses`, over the same engine and answer reader as
//! chat completions: the body is translated into a chat completions body (`input`: the
//! request's items as chat messages; `output`: the answer's parts as output items and typed
//! events). The server keeps no state: `previous_response_id` and `conversation` are refused,
//! the whole input comes with each request.

mod input;
mod output;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use crate::api::{json_object, tagged};
use crate::error::ApiError;
use crate::generation::{self, fresh_id};
use crate::params::Kind;
use crate::prepare::prepare;
use crate::AppState;

/// `POST /v1/responses`.
pub(crate) async fn create(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let id = fresh_id("resp_");
    let response = respond(state, body, &id).await.unwrap_or_else(IntoResponse::into_response);
    tagged(response, &id)
}

async fn respond(state: Arc<AppState>, body: Result<Bytes, BytesRejection>, id: &str) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = json_object(body, state.config.body_limit)?;
    let request = input::translate(&body)?;
    let prepared = prepare(&state, Kind::Chat, request.chat, id).await.map_err(|e| {
        e.renamed("max_tokens", "max_output_tokens")
            .renamed("messages", "input")
            .renamed("response_format.json_schema", "text.format")
            .renamed("response_format", "text.format")
    })?;
    let rendering = output::Rendering::new(id, &state.config.model_id, request.echo, &prepared.parsed.options);
    generation::run(state, prepared, rendering, id, arrived).await
}
