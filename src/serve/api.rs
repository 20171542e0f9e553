//! The OpenAI-compatible request bodies, checked into a [`JobSpec`], and the
//! OpenAI-style error body every failure answers with.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use bmoe_decode::sampling::SamplingParams;

use super::chat_in::{self, InMessage};
use super::constraint::{self, Constraint};
use super::json_in;
use crate::chat::Message;
use crate::chat::TemplateOptions;

/// Stop strings a request may give at most.
pub(crate) const MAX_STOP_STRINGS: usize = 16;

/// An OpenAI-style error: its status and `{"error": {...}}` body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    /// OpenAI's `type` (invalid_request_error, authentication_error, ...).
    pub(crate) kind: &'static str,
    /// The request field at fault, if one is.
    pub(crate) param: Option<&'static str>,
    /// OpenAI's machine-readable `code` (None: the status, as text).
    pub(crate) code: Option<&'static str>,
}

impl ApiError {
    pub(crate) fn invalid(param: Option<&'static str>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
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

    /// This error as the Responses route names its fields (`input` for the
    /// chat routes' `messages`).
    pub(crate) fn for_responses(self) -> Self {
        let param = match self.param {
            Some("messages") => Some("input"),
            p => p,
        };
        Self { param, ..self }
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

    pub(crate) fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code.map_or_else(|| self.status.as_u16().to_string(), str::to_string),
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.log();
        with_retry_after(self.status, axum::Json(self.body()).into_response())
    }
}

impl ApiError {
    /// Say the error in the request's log at `-v` (the status line alone
    /// does not say why a request was refused).
    pub(crate) fn log(&self) {
        tracing::info!(
            status = self.status.as_u16(),
            param = self.param,
            "refused: {}",
            self.message
        );
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

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum StopIn {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub(crate) include_usage: bool,
}

/// The fields both endpoints share (unknown fields are ignored, as OpenAI's
/// clients send some this server has no use for), read from the body beside
/// the route's own.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Common {
    pub(crate) max_tokens: Option<i64>,
    pub(crate) max_completion_tokens: Option<i64>,
    pub(crate) temperature: Option<f32>,
    pub(crate) top_p: Option<f32>,
    pub(crate) top_k: Option<i64>,
    pub(crate) min_p: Option<f32>,
    pub(crate) presence_penalty: Option<f32>,
    pub(crate) frequency_penalty: Option<f32>,
    pub(crate) repeat_penalty: Option<f32>,
    pub(crate) seed: Option<i64>,
    pub(crate) stop: Option<StopIn>,
    #[serde(default)]
    pub(crate) stream: bool,
    pub(crate) stream_options: Option<StreamOptions>,
    pub(crate) n: Option<i64>,
    /// Who asks (OpenAI's end-user id): the `requester` label of the
    /// per-requester metrics.
    pub(crate) user: Option<String>,
}

/// The `requester` label of a request without a `user`.
pub(crate) const ANONYMOUS: &str = "anonymous";

/// Longest `requester` label kept (longer ids are cut).
pub(crate) const REQUESTER_MAX_CHARS: usize = 64;

/// What a request asks the engine for, checked.
#[derive(Debug, Clone)]
pub(crate) struct JobSpec {
    pub(crate) prompt: PromptSpec,
    pub(crate) sampling: SamplingParams,
    pub(crate) stop: Vec<String>,
    /// None: the server's `-n` (set when the job is queued); either is
    /// capped to what the context leaves.
    pub(crate) max_tokens: Option<u32>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    /// The request's `user`, cut to [`REQUESTER_MAX_CHARS`], or [`ANONYMOUS`].
    pub(crate) requester: String,
    /// Only count the prompt's tokens (`/v1/messages/count_tokens`): the
    /// job ends with its `Started` event.
    pub(crate) count_only: bool,
    /// What the reply is held to (a grammar in the sampler).
    pub(crate) constraint: Constraint,
}

#[derive(Debug, Clone)]
pub(crate) enum PromptSpec {
    Chat {
        messages: Vec<Message>,
        /// The request's `tools`, as given.
        tools: Option<serde_json::Value>,
        options: TemplateOptions,
    },
    Text(String),
}

impl PromptSpec {
    pub(crate) fn is_chat(&self) -> bool {
        matches!(self, PromptSpec::Chat { .. })
    }
}

impl ChatRequest {
    pub(crate) fn into_spec(self, defaults: &SamplingParams) -> Result<JobSpec, ApiError> {
        let messages = chat_in::messages(self.messages)?;
        let (tools, choice) = chat_in::tools(self.tools, self.tool_choice)?;
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

impl Common {
    pub(crate) fn into_spec(
        self,
        prompt: PromptSpec,
        defaults: &SamplingParams,
    ) -> Result<JobSpec, ApiError> {
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::invalid(
                Some("n"),
                format!("n = {n}: this server returns one choice per request (n = 1)"),
            ));
        }
        let sampling = self.sampling(defaults)?;
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => None,
            Some(m) if m >= 1 => Some(m.min(u32::MAX as i64) as u32),
            Some(m) => {
                return Err(ApiError::invalid(
                    Some("max_tokens"),
                    format!("max_tokens = {m}: give at least 1"),
                ))
            }
        };
        let stop = match self.stop {
            None => Vec::new(),
            Some(StopIn::One(s)) => vec![s],
            Some(StopIn::Many(v)) => v,
        };
        if stop.len() > MAX_STOP_STRINGS {
            return Err(ApiError::invalid(
                Some("stop"),
                format!(
                    "{} stop strings: give at most {MAX_STOP_STRINGS}",
                    stop.len()
                ),
            ));
        }
        Ok(JobSpec {
            prompt,
            sampling,
            stop,
            max_tokens,
            stream: self.stream,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            requester: requester(self.user.as_deref()),
            count_only: false,
            constraint: Constraint::None,
        })
    }

    /// The server's defaults with the request's settings over them.
    fn sampling(&self, defaults: &SamplingParams) -> Result<SamplingParams, ApiError> {
        let top_k = match self.top_k {
            Some(k) if !(0..=u32::MAX as i64).contains(&k) => {
                return Err(ApiError::invalid(
                    Some("top_k"),
                    format!("top_k = {k}: give 0 (off) or more"),
                ))
            }
            k => k.map(|k| k as u32),
        };
        let seed = match self.seed {
            Some(s) if !(0..=u32::MAX as i64).contains(&s) => {
                return Err(ApiError::invalid(
                    Some("seed"),
                    format!("seed = {s}: give 0..=4294967295"),
                ))
            }
            Some(s) => s as u32,
            // Unseeded draws differ from request to request, as OpenAI's do.
            None if self.temperature.is_some_and(|t| t > 0.0) || !defaults.is_greedy() => {
                fresh_seed()
            }
            None => defaults.seed,
        };
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_k: top_k.unwrap_or(defaults.top_k),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(defaults.repeat_penalty),
            repeat_last_n: defaults.repeat_last_n,
            presence_penalty: self.presence_penalty.unwrap_or(defaults.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(defaults.frequency_penalty),
            seed,
        };
        p.check()
            .map_err(|(name, why)| ApiError::invalid(Some(name), format!("{name} {why}")))?;
        Ok(p)
    }
}

/// A seed from the clock, for requests that give none.
fn fresh_seed() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ d.as_secs() as u32)
        .unwrap_or(0);
    nanos.wrapping_mul(0x9E37_79B9)
}

/// Parse a JSON body into the route's request, an OpenAI-style 400 naming
/// the field at fault in JSON's words ([`json_in`]).
pub(crate) fn parse<T: RouteBody>(body: &[u8]) -> Result<T, ApiError> {
    let v = json_in::body(body)?;
    let own: T = json_in::read(&v)?;
    Ok(own.with_common(json_in::read(&v)?))
}

/// The metrics label for a request's `user`.
fn requester(user: Option<&str>) -> String {
    match user.map(str::trim) {
        Some(u) if !u.is_empty() => u.chars().take(REQUESTER_MAX_CHARS).collect(),
        _ => ANONYMOUS.to_string(),
    }
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
