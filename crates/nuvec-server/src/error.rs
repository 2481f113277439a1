//! Errors: the crate's own ([`Error`], starting a server) and the HTTP ones ([`ApiError`],
//! OpenAI's error object `{"error": {"message", "type", "param", "code"}}` with its status).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// What can go wrong starting or running a server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime refused the model or the batcher's settings.
    #[error(transparent)]
    Runtime(#[from] nuvec_lm::Error),
    /// A socket or the async runtime failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done ("binding 127.0.0.1:8080").
        what: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A setting that cannot work, named.
    #[error("{0}")]
    Invalid(String),
    /// The engine thread ended before it started serving.
    #[error("the engine thread failed to start: {0}")]
    Engine(String),
}

/// An OpenAI-shaped error response.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What is wrong and, where it helps, how to fix it.
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`...
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A short machine-readable code, if there is one.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: Some("invalid_value"),
        }
    }

    /// A 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// A 400 for a parameter whose value asks for something this server does not do.
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        ApiError { code: Some("unsupported_parameter"), ..Self::invalid(param, message) }
    }

    /// A 404 for an unknown route.
    pub fn no_route(method: &str, path: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("Invalid URL ({method} {path})"),
            kind: "invalid_request_error",
            param: None,
            code: Some("unknown_url"),
        }
    }

    /// A 404 for a model this server does not serve.
    pub fn no_model(asked: &str, served: &str, adapters: &[String]) -> Self {
        let mut ids = format!("`{served}`");
        for a in adapters {
            ids += &format!(", `{a}`");
        }
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{asked}` does not exist: this server serves {ids} (GET /v1/models)"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// A 500 naming the request it happened to, so the log can be searched for it.
    pub fn internal(request_id: &str, message: impl std::fmt::Display) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("internal error in request {request_id}: {message}"),
            kind: "server_error",
            param: None,
            code: Some("internal_error"),
        }
    }

    /// A 429: the queue of `max` (`--max-queue`) has no room for a request's choices.
    pub fn queue_full(max: usize) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "the server is at capacity: its queue holds {max} requests (--max-queue; one of n choices takes n \
                 places) and has no room for this one; retry after a moment"
            ),
            kind: "rate_limit_exceeded",
            param: None,
            code: Some("rate_limit_exceeded"),
        }
    }

    /// A 503: the engine failed and takes no more requests.
    pub fn unavailable(why: &str) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!("the server cannot take requests: {why}"),
            kind: "server_error",
            param: None,
            code: Some("engine_failed"),
        }
    }

    /// This error as a protocol that calls field `from` `to` names it (a `/v1/responses`
    /// body's `max_output_tokens` is checked as chat completions' `max_tokens`): the param, a
    /// path under it, and the field's name in the message.
    pub(crate) fn renamed(mut self, from: &str, to: &str) -> Self {
        if let Some(param) = &self.param {
            let under = param.strip_prefix(from).filter(|rest| rest.is_empty() || rest.starts_with(['.', '[']));
            if let Some(rest) = under {
                self.param = Some(format!("{to}{rest}"));
                // Only names no prose uses ("max_tokens", not "messages") are renamed in the text.
                if from.contains('_') {
                    self.message = self.message.replace(from, to);
                }
            }
        }
        self
    }

    /// The body: `{"error": {...}}`.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}
