//! OpenAI's Responses API, `POST /v1/responses` (what Codex and the
//! `openai` client's `responses.create`/`.stream` speak), next to the chat
//! route: the body becomes the same [`JobSpec`] on the
//! same queue and engine thread ([`request`]), and the worker's events come
//! back as a `response` object or its server-sent events ([`reply`]).
//! Nothing is stored: `previous_response_id` is refused (docs/serving.md).

mod reply;
mod request;

use bmoe_decode::sampling::SamplingParams;

use crate::serve::answer::Route;
use crate::serve::app::{reply_id, App};
use crate::serve::error::ApiError;
use crate::serve::job::{now_s, JobSpec, Started};
use crate::serve::split::ReplySplit;
use reply::events::Streamer;
use reply::Head;

/// The route.
pub(crate) const RESPONSES: &str = "/v1/responses";

/// `POST /v1/responses`, answered whole or streamed by the answer loop;
/// every failure before the first event is an OpenAI-shaped error naming
/// the field. What the response echoes of the request:
pub(crate) struct Responses {
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    temperature: f32,
    top_p: f32,
}

impl Route for Responses {
    const LABEL: &'static str = "responses";
    type Reply = Streamer;

    fn read(body: &[u8], defaults: &SamplingParams) -> Result<(JobSpec, Self), ApiError> {
        let req = request::parse(body, defaults)?;
        let echo = Self {
            instructions: req.instructions,
            max_output_tokens: req.max_output_tokens,
            temperature: req.spec.sampling.temperature,
            top_p: req.spec.sampling.top_p,
        };
        Ok((req.spec, echo))
    }

    fn reply(self, app: &App, _started: &Started, split: ReplySplit) -> Streamer {
        Streamer::new(Head {
            id: reply_id(app, "resp_"),
            created_at: now_s(),
            model: app.model_id.clone(),
            instructions: self.instructions,
            max_output_tokens: self.max_output_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            calls: split,
        })
    }

    /// The Responses route names its conversation `input` (the chat
    /// routes' `messages`).
    fn start_failed(e: ApiError) -> ApiError {
        match e.param() {
            Some("messages") => ApiError {
                param: Some("input".into()),
                ..e
            },
            _ => e,
        }
    }
}
