//! The two errors of `bmoe serve`: the one a request is answered with
//! ([`ApiError`], OpenAI's `{"error": {...}}` body unless a dialect shapes
//! it its own way) and the one the server stops with ([`ServeError`]). A
//! leaf: it imports no other file of serve.

use std::borrow::Cow;
use std::net::SocketAddr;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::engine::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("cannot start the engine thread: {0}")]
    Thread(std::io::Error),
    #[error("the engine thread ended while loading the model")]
    EngineThread,
    #[error(
        "cannot listen on {addr}: {source} (is another server on that port? pick one with --port)"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the server failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("metrics: {0}")]
    Metrics(String),
}

/// An OpenAI-style error: its status and `{"error": {...}}` body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    /// OpenAI's `type` (invalid_request_error, authentication_error, ...).
    pub(crate) kind: &'static str,
    /// The request field at fault, if one is (OpenAI's `param`: a
    /// top-level field; the path inside it is in the message).
    pub(crate) param: Option<Cow<'static, str>>,
    /// OpenAI's machine-readable `code` (None: the status, as text).
    pub(crate) code: Option<&'static str>,
}

impl ApiError {
    pub(crate) fn invalid(
        param: Option<impl Into<Cow<'static, str>>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(Into::into),
            code: None,
        }
    }

    /// A 400 about the field at `path` (`messages[2].content`): its `param`
    /// is the path's top-level field (`messages`), none for the body itself.
    pub(crate) fn at(path: &str, message: impl Into<String>) -> Self {
        let top = path.split(['.', '[']).next().unwrap_or("");
        let param = (!top.is_empty()).then(|| top.to_string());
        Self::invalid(param, message)
    }

    /// A 400 about the body as a whole (no field).
    pub(crate) fn body(message: impl Into<String>) -> Self {
        Self::invalid(None::<&'static str>, message)
    }

    /// The `param` as text, if any.
    pub(crate) fn param(&self) -> Option<&str> {
        self.param.as_deref()
    }

    /// A prompt longer than the context: 400 in the words clients act on
    /// (Anthropic's `prompt is too long: N tokens > M maximum`, OpenAI's
    /// code `context_length_exceeded`), so an agent compacts its history.
    pub(crate) fn over_context(prompt_tokens: usize, n_ctx: usize) -> Self {
        Self {
            code: Some("context_length_exceeded"),
            ..Self::invalid(
                Some("messages"),
                format!(
                    "prompt is too long: {prompt_tokens} tokens > {} maximum (the server's -c {n_ctx} \
                     holds the prompt and at least one reply token): shorten the conversation, or \
                     restart the server with a larger -c",
                    n_ctx.saturating_sub(1)
                ),
            )
        }
    }

    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 503: the engine is gone.
    pub(crate) fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is shutting down",
        )
    }

    /// 500 with `msg`.
    pub(crate) fn server(msg: &str) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            msg.to_string(),
        )
    }

    /// OpenAI's error body.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code.map_or_else(|| self.status.as_u16().to_string(), str::to_string),
        }})
    }

    /// Say the error in the request's log at `-v` (the status line alone
    /// does not say why a request was refused).
    pub(crate) fn log(&self) {
        tracing::info!(
            status = self.status.as_u16(),
            param = self.param(),
            "refused: {}",
            self.message
        );
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.log();
        with_retry_after(self.status, axum::Json(self.json()).into_response())
    }
}

/// Seconds a client is told to wait before retrying a full queue (429) or a
/// server shutting down (503).
pub(crate) const RETRY_AFTER_S: u32 = 1;

/// `response` with `status`, and a `Retry-After` when the status asks a
/// client to come back later.
pub(crate) fn with_retry_after(status: StatusCode, response: Response) -> Response {
    let mut response = response;
    *response.status_mut() = status;
    if matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(RETRY_AFTER_S),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_body_is_openai_shaped_and_a_path_names_its_field() {
        let b = ApiError::invalid(Some("stop"), "too many").json();
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["param"], "stop");
        assert_eq!(b["error"]["message"], "too many");
        assert_eq!(
            ApiError::at("messages[2].content", "x").param(),
            Some("messages")
        );
        assert_eq!(ApiError::at("text.format", "x").param(), Some("text"));
        assert_eq!(ApiError::at("", "x").param(), None);
    }
}
