//! OpenAI's chat and text completions, `POST /v1/chat/completions` and
//! `POST /v1/completions`: the body read into a [`JobSpec`] ([`request`],
//! the chat messages and tools in [`messages`]) and the worker's events
//! answered as OpenAI's objects or chunks ([`reply`]), through the one
//! answer loop (`answer.rs`). Errors are OpenAI's shape, `ApiError`'s own.

mod messages;
pub(crate) mod reply;
pub(crate) mod request;

use bmoe_decode::sampling::SamplingParams;

use crate::serve::answer::Route;
use crate::serve::app::{reply_id, App};
use crate::serve::error::ApiError;
use crate::serve::job::{now_s, JobSpec, Started};
use crate::serve::split::ReplySplit;
use reply::Reply;
use request::{parse, ChatRequest, CompletionRequest};

/// The chat route.
pub(crate) const CHAT: &str = "/v1/chat/completions";

/// The text completion route.
pub(crate) const COMPLETIONS: &str = "/v1/completions";

/// What an OpenAI reply needs of its request.
pub(crate) struct Asked {
    chat: bool,
    include_usage: bool,
}

impl Asked {
    fn of(spec: &JobSpec) -> Self {
        Self {
            chat: spec.prompt.is_chat(),
            include_usage: spec.include_usage,
        }
    }

    fn reply(self, app: &App, split: ReplySplit) -> Reply {
        Reply {
            id: reply_id(app, if self.chat { "chatcmpl-" } else { "cmpl-" }),
            created: now_s(),
            model: app.model_id.clone(),
            chat: self.chat,
            split: Some(split.stream()),
            calls: split,
            include_usage: self.include_usage,
        }
    }
}

/// `POST /v1/chat/completions`.
pub(crate) struct Chat(Asked);

impl Route for Chat {
    const LABEL: &'static str = "chat";
    type Reply = Reply;

    fn read(body: &[u8], defaults: &SamplingParams) -> Result<(JobSpec, Self), ApiError> {
        let spec = parse::<ChatRequest>(body)?.into_spec(defaults)?;
        let asked = Asked::of(&spec);
        Ok((spec, Self(asked)))
    }

    fn reply(self, app: &App, _started: &Started, split: ReplySplit) -> Reply {
        self.0.reply(app, split)
    }
}

/// `POST /v1/completions`.
pub(crate) struct Completions(Asked);

impl Route for Completions {
    const LABEL: &'static str = "completions";
    type Reply = Reply;

    fn read(body: &[u8], defaults: &SamplingParams) -> Result<(JobSpec, Self), ApiError> {
        let spec = parse::<CompletionRequest>(body)?.into_spec(defaults)?;
        let asked = Asked::of(&spec);
        Ok((spec, Self(asked)))
    }

    fn reply(self, app: &App, _started: &Started, split: ReplySplit) -> Reply {
        self.0.reply(app, split)
    }
}
