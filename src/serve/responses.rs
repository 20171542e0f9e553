//! OpenAI's Responses API, `POST /v1/responses` (what Codex and the
//! `openai` client's `responses.create`/`.stream` speak), next to the chat
//! route: the body becomes the same [`JobSpec`](super::api::JobSpec) on the
//! same queue and engine thread ([`request`]), and the worker's events come
//! back as a `response` object or its server-sent events ([`reply`]).
//! Nothing is stored: `previous_response_id` is refused (docs/serving.md).

mod reply;
mod request;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::metrics as m;
use super::routes;
use super::worker::App;

/// The route.
pub(crate) const RESPONSES: &str = "/v1/responses";

/// The metrics label of the route.
const ROUTE: &str = "responses";

/// `POST /v1/responses`: queue the job and answer whole or streamed; every
/// failure before the first event is an OpenAI-shaped error naming the field.
pub(crate) async fn responses(State(app): State<App>, body: Body) -> Response {
    let parsed = routes::read_body(&app, body)
        .await
        .and_then(|b| request::parse(&b, &app.defaults));
    let res = match parsed {
        Ok(req) => reply::run(&app, req).await,
        Err(e) => Err(e),
    };
    match res {
        Ok(r) => {
            m::request(ROUTE, 200);
            r
        }
        Err(e) => {
            m::request(ROUTE, e.status.as_u16());
            e.into_response()
        }
    }
}
