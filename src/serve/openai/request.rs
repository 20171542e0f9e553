//! OpenAI's two request bodies (`/v1/chat/completions`, `/v1/completions`)
//! read with serde, each refusal naming the field's path ([`json_in`]), and
//! checked into a [`JobSpec`].

use serde::de::DeserializeOwned;
use serde::Deserialize;

use bmoe_decode::sampling::SamplingParams;

use super::messages::{self, InMessage};
use crate::chat::TemplateOptions;
use crate::serve::common::Common;
use crate::serve::constraint;
use crate::serve::error::ApiError;
use crate::serve::job::{Constraint, JobSpec, PromptSpec};
use crate::serve::json_in;

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    pub(crate) messages: Vec<InMessage>,
    /// OpenAI's `tools`: the functions the model may call.
    #[serde(default)]
    pub(crate) tools: Option<serde_json::Value>,
    /// `none`, `auto`, `required` or one function by name.
    #[serde(default)]
    pub(crate) tool_choice: Option<serde_json::Value>,
    /// `text`, `json_object` or `json_schema`: structured output.
    #[serde(default)]
    pub(crate) response_format: Option<serde_json::Value>,
    /// The fields both routes share (read from the same body by [`parse`]).
    #[serde(skip)]
    pub(crate) common: Common,
    /// Options the chat template reads (e.g. `{"enable_thinking": false}`),
    /// as llama.cpp's server names them.
    #[serde(default)]
    pub(crate) chat_template_kwargs: Option<TemplateOptions>,
    /// `none` turns the template's reasoning off (`enable_thinking`
    /// false); another effort is passed to the template as
    /// `reasoning_effort` (gpt-oss reads it).
    #[serde(default)]
    pub(crate) reasoning_effort: Option<String>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub(crate) struct CompletionRequest {
    pub(crate) prompt: PromptIn,
    /// OpenAI's options this server has not: each refused unless left at
    /// its default (false, null, "", 1) rather than silently ignored.
    pub(crate) echo: Option<bool>,
    pub(crate) logprobs: Option<i64>,
    pub(crate) suffix: Option<String>,
    pub(crate) best_of: Option<i64>,
    /// The fields both routes share (read from the same body by [`parse`]).
    #[serde(skip)]
    pub(crate) common: Common,
}

/// A request body of the two OpenAI routes: its own fields, then the ones
/// both share.
pub(crate) trait RouteBody: DeserializeOwned {
    fn with_common(self, common: Common) -> Self;
}

impl RouteBody for ChatRequest {
    fn with_common(self, common: Common) -> Self {
        Self { common, ..self }
    }
}

impl RouteBody for CompletionRequest {
    fn with_common(self, common: Common) -> Self {
        Self { common, ..self }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum PromptIn {
    Text(String),
    List(Vec<String>),
}

impl ChatRequest {
    pub(crate) fn into_spec(self, defaults: &SamplingParams) -> Result<JobSpec, ApiError> {
        let messages = messages::messages(self.messages)?;
        let (tools, choice) = messages::tools(self.tools, self.tool_choice)?;
        let format = constraint::response_format(self.response_format.as_ref(), "response_format")?;
        let constraint = Constraint::of(choice, tools.is_some(), format);
        let prompt = PromptSpec::Chat {
            messages,
            tools,
            options: template_options(self.chat_template_kwargs, self.reasoning_effort),
        };
        let spec = JobSpec {
            constraint,
            ..self.common.into_spec(prompt, defaults)?
        };
        Constraint::check(&spec)?;
        Ok(spec)
    }
}

/// The options the template reads: the request's `chat_template_kwargs`,
/// and its `reasoning_effort` where they do not say otherwise.
fn template_options(kwargs: Option<TemplateOptions>, effort: Option<String>) -> TemplateOptions {
    let mut options = kwargs.unwrap_or_default();
    match effort.as_deref() {
        None => {}
        Some("none") => {
            options
                .entry("enable_thinking")
                .or_insert(serde_json::Value::Bool(false));
        }
        Some(e) => {
            options
                .entry("reasoning_effort")
                .or_insert_with(|| e.into());
        }
    }
    options
}

impl CompletionRequest {
    pub(crate) fn into_spec(self, defaults: &SamplingParams) -> Result<JobSpec, ApiError> {
        self.check_unsupported()?;
        let text = match self.prompt {
            PromptIn::Text(t) => t,
            PromptIn::List(mut l) if l.len() == 1 => l.remove(0),
            PromptIn::List(_) => {
                return Err(ApiError::invalid(
                    Some("prompt"),
                    "prompt: give one string (a list of several prompts is not supported; send one request each)",
                ))
            }
        };
        if text.is_empty() {
            return Err(ApiError::invalid(Some("prompt"), "prompt is empty"));
        }
        self.common.into_spec(PromptSpec::Text(text), defaults)
    }

    /// `echo`, `logprobs`, `suffix` and `best_of` at their defaults, or a
    /// 400 naming the one that is not.
    fn check_unsupported(&self) -> Result<(), ApiError> {
        let refuse = |param: &'static str, what: String| Err(ApiError::invalid(Some(param), what));
        if self.echo == Some(true) {
            return refuse("echo", "echo = true: this server does not return the prompt with the completion; leave echo out or false".into());
        }
        if let Some(n) = self.logprobs {
            return refuse("logprobs", format!("logprobs = {n}: this server does not return log probabilities; leave logprobs out or null"));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return refuse("suffix", "suffix: this server does not insert text before a suffix (fill-in-the-middle); leave suffix out or null".into());
        }
        if let Some(n) = self.best_of.filter(|&n| n != 1) {
            return refuse(
                "best_of",
                format!(
                    "best_of = {n}: this server generates one completion per request (best_of = 1)"
                ),
            );
        }
        Ok(())
    }
}

/// Parse a JSON body into the route's request, an OpenAI-style 400 naming
/// the field at fault in JSON's words ([`json_in`]).
pub(crate) fn parse<T: RouteBody>(body: &[u8]) -> Result<T, ApiError> {
    let v = json_in::body(body)?;
    let own: T = json_in::read(&v)?;
    Ok(own.with_common(json_in::read(&v)?))
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
