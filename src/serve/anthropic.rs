//! Anthropic's Messages API, `POST /v1/messages`, next to the OpenAI routes:
//! the request body becomes the same [`JobSpec`](super::api::JobSpec) on the
//! same queue and engine thread ([`request`]), and the worker's events come
//! back as an Anthropic message or its server-sent events ([`reply`]). Every
//! failure answers in Anthropic's error shape (docs/serving.md).

mod reply;
mod request;

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use request::Purpose;

use super::api::ApiError;
use super::metrics as m;
use super::routes;
use super::worker::App;

/// The route.
pub(crate) const MESSAGES: &str = "/v1/messages";

/// The route that counts a request's prompt tokens.
pub(crate) const COUNT_TOKENS: &str = "/v1/messages/count_tokens";

/// The metrics label of the route.
const ROUTE: &str = "messages";

/// `POST /v1/messages`: queue the job and answer whole or streamed.
pub(crate) async fn messages(State(app): State<App>, body: Body) -> Response {
    let parsed = routes::read_body(&app, body)
        .await
        .and_then(|b| request::parse(&b, &app.defaults, Purpose::Reply));
    let res = match parsed {
        Ok(req) => reply::run(&app, req).await,
        Err(e) => Err(e),
    };
    answered(ROUTE, res)
}

/// `POST /v1/messages/count_tokens`: the body a `/v1/messages` request
/// would send (`max_tokens` optional), rendered as it would be, answered
/// `{"input_tokens": N}` with nothing generated.
pub(crate) async fn count_tokens(State(app): State<App>, body: Body) -> Response {
    let parsed = routes::read_body(&app, body)
        .await
        .and_then(|b| request::parse(&b, &app.defaults, Purpose::Count));
    let res = match parsed {
        Ok(req) => routes::start_job(&app, req.spec)
            .await
            .map(|(_, s)| Json(json!({"input_tokens": s.prompt_tokens})).into_response()),
        Err(e) => Err(e),
    };
    answered("count_tokens", res)
}

/// The response, or the error in Anthropic's shape, counted under `route`.
fn answered(route: &'static str, res: Result<Response, ApiError>) -> Response {
    match res {
        Ok(r) => {
            m::request(route, 200);
            r
        }
        Err(e) => {
            m::request(route, e.status.as_u16());
            error_response(e)
        }
    }
}

/// Anthropic's name for an error of this status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    }
}

/// `{"type": "error", "error": {"type": ..., "message": ...}}`.
pub(crate) fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

/// The error as Anthropic answers one: its status and [`error_body`].
pub(crate) fn error_response(e: ApiError) -> Response {
    e.log();
    crate::serve::api::with_retry_after(e.status, axum::Json(error_body(&e)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_anthropic_shaped() {
        let b = error_body(&ApiError::invalid(
            Some("max_tokens"),
            "max_tokens is required",
        ));
        assert_eq!(b["type"], "error");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["message"], "max_tokens is required");
        let kinds = [
            (StatusCode::UNAUTHORIZED, "authentication_error"),
            (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large"),
            (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            (StatusCode::SERVICE_UNAVAILABLE, "overloaded_error"),
            (StatusCode::INTERNAL_SERVER_ERROR, "api_error"),
        ];
        for (status, kind) in kinds {
            let e = ApiError::new(status, "server_error", "x");
            assert_eq!(error_body(&e)["error"]["type"], kind, "{status}");
        }
    }
}
