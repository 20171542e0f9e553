//! Anthropic's Messages API, `POST /v1/messages`, next to the OpenAI routes:
//! the request body becomes the same [`JobSpec`] on the
//! same queue and engine thread ([`request`]), and the worker's events come
//! back as an Anthropic message or its server-sent events ([`reply`]). Every
//! failure answers in Anthropic's error shape (docs/serving.md).

pub(crate) mod reply;
mod request;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bmoe_decode::sampling::SamplingParams;
use serde_json::json;

pub(crate) use reply::{error_body, error_response};
use reply::{Head, Streamer};
use request::Purpose;

use crate::serve::answer::{read_body, start_job, Route};
use crate::serve::app::{reply_id, App};
use crate::serve::error::ApiError;
use crate::serve::job::{JobSpec, Started};
use crate::serve::metrics as m;
use crate::serve::split::ReplySplit;

/// The route.
pub(crate) const MESSAGES: &str = "/v1/messages";

/// The route that counts a request's prompt tokens.
pub(crate) const COUNT_TOKENS: &str = "/v1/messages/count_tokens";

/// `POST /v1/messages`, answered whole or streamed by the answer loop.
pub(crate) struct Messages;

impl Route for Messages {
    const LABEL: &'static str = "messages";
    type Reply = Streamer;

    fn read(body: &[u8], defaults: &SamplingParams) -> Result<(JobSpec, Self), ApiError> {
        let req = request::parse(body, defaults, Purpose::Reply)?;
        Ok((req.spec, Self))
    }

    fn reply(self, app: &App, started: &Started, split: ReplySplit) -> Streamer {
        Streamer::new(Head {
            id: reply_id(app, "msg_"),
            model: app.model_id.clone(),
            prompt_tokens: started.prompt_tokens,
            calls: split,
        })
    }

    fn refuse(e: ApiError) -> Response {
        error_response(e)
    }
}

/// `POST /v1/messages/count_tokens`: the body a `/v1/messages` request
/// would send (`max_tokens` optional), rendered as it would be, answered
/// `{"input_tokens": N}` with nothing generated.
pub(crate) async fn count_tokens(State(app): State<App>, body: Body) -> Response {
    let counted = async {
        let b = read_body(&app, body).await?;
        let req = request::parse(&b, &app.defaults, Purpose::Count)?;
        let (_, s) = start_job(&app, req.spec).await?;
        Ok::<_, ApiError>(Json(json!({"input_tokens": s.prompt_tokens})).into_response())
    };
    match counted.await {
        Ok(r) => {
            m::request("count_tokens", 200);
            r
        }
        Err(e) => {
            m::request("count_tokens", e.status.as_u16());
            error_response(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

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
