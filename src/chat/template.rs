//! A conversation as prompt text: the model's own `tokenizer.chat_template`
//! rendered as Hugging Face transformers renders it ([`super::jinja`]), or,
//! only for a file that carries no template, llama.cpp's built-in chatml.

use crate::llama::{ChatMessage, Model, Token};

use super::jinja::Now;
use super::message::Message;
use super::sandbox::{self, Job};
use super::tool_calls::CallFormat;
use super::tool_prompt;

pub use super::sandbox::TemplateError;

/// Which renderer produced the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateSource {
    /// The gguf's own Jinja template.
    Jinja,
    /// llama.cpp's built-in chatml (the gguf carries no template).
    Builtin,
}

impl TemplateSource {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            TemplateSource::Jinja => "the model's own Jinja chat template",
            TemplateSource::Builtin => {
                "llama.cpp's built-in chatml template (the model file carries no chat template)"
            }
        }
    }
}

/// Template options beyond the messages (such as a reasoning switch, which
/// templates read as `enable_thinking` or similar): name and JSON value.
pub type TemplateOptions = serde_json::Map<String, serde_json::Value>;

/// What a template renders: the conversation and what goes with it.
#[derive(Debug, Clone, Copy)]
pub struct ChatInput<'a> {
    pub messages: &'a [Message],
    /// The tools offered (OpenAI's `tools` array); None renders as `none`.
    pub tools: Option<&'a serde_json::Value>,
    pub options: &'a TemplateOptions,
    /// Open the assistant's turn after the last message. An assistant
    /// message given last (one without tool calls: a prefill) is continued
    /// instead, whatever this says ([`ChatTemplate::render`]).
    pub add_generation_prompt: bool,
}

impl<'a> ChatInput<'a> {
    /// The messages with the assistant's turn opened, no tools, no options.
    pub fn messages(messages: &'a [Message], options: &'a TemplateOptions) -> Self {
        Self {
            messages,
            tools: None,
            options,
            add_generation_prompt: true,
        }
    }
}

/// A rendered prompt and which renderer made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub source: TemplateSource,
}

impl Rendered {
    /// What to say on stderr about how the prompt was made, if anything.
    pub fn note(&self) -> Option<String> {
        (self.source != TemplateSource::Jinja)
            .then(|| format!("chat prompt rendered with {}", self.source.describe()))
    }
}

/// A model's chat template, ready to render conversations.
pub struct ChatTemplate {
    /// The Jinja source (None: the model carries none).
    source: Option<String>,
    bos: String,
    eos: String,
    /// The time `strftime_now` reads (None: the clock).
    now: Option<Now>,
}

/// The most bytes of a rendered prompt the debug log shows.
const PROMPT_LOG_MAX_BYTES: usize = 16 * 1024;

/// The start of `text` the log shows: at most [`PROMPT_LOG_MAX_BYTES`], cut
/// at a character's boundary.
fn log_head(text: &str) -> &str {
    let mut end = text.len().min(PROMPT_LOG_MAX_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl ChatTemplate {
    /// The model's template, or `source` instead when given.
    pub fn of(model: &Model, source: Option<&str>) -> Self {
        let (bos, eos) = model.bos_eos_text();
        let source = source.map(str::to_string).or_else(|| model.chat_template());
        Self::new(source, &bos, &eos)
    }

    /// A template from its source and the texts of the bos and eos tokens.
    pub fn new(source: Option<String>, bos: &str, eos: &str) -> Self {
        Self {
            source,
            bos: bos.into(),
            eos: eos.into(),
            now: None,
        }
    }

    /// Whether the model (or --chat-template-file) gives a Jinja template.
    pub fn has_jinja(&self) -> bool {
        self.source.is_some()
    }

    /// `strftime_now` reads `now` instead of the clock (for tests).
    #[cfg(test)]
    pub(crate) fn at(mut self, now: Now) -> Self {
        self.now = Some(now);
        self
    }

    /// The prompt for `input`: the model's Jinja template, or llama.cpp's
    /// built-in chatml only when the file carries no template.
    /// Tools given to a template that takes none are described in the
    /// system message instead ([`super::tool_prompt`]). An assistant message
    /// given last is continued: its turn left open, the reply its
    /// continuation (Anthropic's prefill, llama-server's too).
    /// A signal (SIGINT, SIGTERM) stops the render ([`Self::render_until`]).
    pub fn render(&self, model: &Model, input: &ChatInput) -> Result<Rendered, TemplateError> {
        self.render_until(model, input, &signalled)
    }

    /// [`Self::render`], stopped as soon as `cancelled` says why the prompt is
    /// no longer wanted (a signal, a client that went away).
    pub fn render_until(
        &self,
        model: &Model,
        input: &ChatInput,
        cancelled: &dyn Fn() -> Option<&'static str>,
    ) -> Result<Rendered, TemplateError> {
        let rendered = if continues_last(input.messages) {
            continuing(input, |i| self.render_any(model, i, cancelled))?
        } else {
            self.render_any(model, input, cancelled)?
        };
        if tracing::enabled!(tracing::Level::DEBUG) {
            let head = log_head(&rendered.text);
            tracing::debug!(
                "chat prompt ({}, {} bytes{}):\n{head}",
                rendered.source.describe(),
                rendered.text.len(),
                if head.len() < rendered.text.len() {
                    ", its first 16 KiB shown"
                } else {
                    ""
                }
            );
        }
        Ok(rendered)
    }

    fn render_any(
        &self,
        model: &Model,
        input: &ChatInput,
        cancelled: &dyn Fn() -> Option<&'static str>,
    ) -> Result<Rendered, TemplateError> {
        let described;
        let input = match input.tools {
            Some(tools) if !self.reads_tools() => {
                described = tool_prompt::describe(input.messages, tools);
                &ChatInput {
                    messages: &described,
                    tools: None,
                    ..*input
                }
            }
            // Earlier calls and results without tools offered: still text
            // the model reads (such a template drops them).
            None if !self.reads_tools() && tool_prompt::has_calls(input.messages) => {
                described = tool_prompt::inline_calls(input.messages);
                &ChatInput {
                    messages: &described,
                    ..*input
                }
            }
            _ => input,
        };
        match self.source.as_deref() {
            Some(source) => Ok(Rendered {
                text: sandbox::render(&self.job(source, input), cancelled)?,
                source: TemplateSource::Jinja,
            }),
            None => {
                let messages: Vec<ChatMessage> = input
                    .messages
                    .iter()
                    .map(|m| ChatMessage {
                        role: m.role.clone(),
                        content: m.content.clone(),
                    })
                    .collect();
                let text = model
                    .apply_builtin_template(&messages, input.add_generation_prompt)
                    .map_err(TemplateError::Builtin)?;
                Ok(Rendered {
                    text,
                    source: TemplateSource::Builtin,
                })
            }
        }
    }

    /// Whether the template reads `tools` (else they go in the system
    /// message, the Hermes way).
    pub(crate) fn reads_tools(&self) -> bool {
        self.source.as_deref().is_some_and(tool_prompt::reads_tools)
    }

    /// How the model writes tool calls under this template: the template's
    /// own way, or the Hermes way bmoe's tool description asks for.
    pub fn call_format(&self) -> CallFormat {
        match self.source.as_deref() {
            Some(s) if tool_prompt::reads_tools(s) => CallFormat::detect(s),
            _ => CallFormat::Hermes,
        }
    }

    /// Whether the template writes reasoning in `<think>` blocks.
    pub fn thinks(&self) -> bool {
        self.source
            .as_deref()
            .is_some_and(crate::chat::reasoning::template_thinks)
    }

    /// `text` as one user message: the rendered prompt (its note, if any,
    /// said on stderr) and its tokens. What `run --chat` and `--show-prompt` use.
    pub fn user_prompt(
        &self,
        model: &Model,
        text: &str,
    ) -> Result<(Rendered, Vec<Token>), TemplateError> {
        let messages = [Message::new("user", text)];
        let options = TemplateOptions::new();
        let rendered = self.render(model, &ChatInput::messages(&messages, &options))?;
        if let Some(note) = rendered.note() {
            crate::say!("{note}");
        }
        let tokens = self.tokens(model, &rendered)?;
        Ok((rendered, tokens))
    }

    /// The prompt's tokens: a Jinja template writes its own special tokens
    /// (nothing is added, as transformers adds none), the built-in one gets
    /// the model's BOS unless its text already starts with it.
    pub fn tokens(&self, model: &Model, rendered: &Rendered) -> Result<Vec<Token>, TemplateError> {
        let add_special = match rendered.source {
            TemplateSource::Jinja => false,
            TemplateSource::Builtin => self.bos.is_empty() || !rendered.text.starts_with(&self.bos),
        };
        model
            .tokenize(&rendered.text, add_special, true)
            .map_err(TemplateError::Tokenize)
    }

    /// What the renderer needs for `input`: the source and the variables
    /// transformers' `apply_chat_template` gives: the options, then
    /// `messages`, `tools` (none when absent), `documents` (none),
    /// `add_generation_prompt` and the bos/eos texts.
    pub(super) fn job(&self, source: &str, input: &ChatInput) -> Job {
        let mut vars = input.options.clone();
        let mut set = |k: &str, v: serde_json::Value| vars.insert(k.into(), v);
        set("messages", serde_json::json!(input.messages));
        set("tools", input.tools.cloned().unwrap_or_default());
        set("documents", serde_json::Value::Null);
        set("add_generation_prompt", input.add_generation_prompt.into());
        set("bos_token", self.bos.clone().into());
        set("eos_token", self.eos.clone().into());
        Job {
            source: source.to_string(),
            vars,
            now_us: self.now.map(|n| n.timestamp_micros()),
        }
    }

    /// The Jinja template rendered in this process, within the step and
    /// output limits (not the memory limit: see [`super::sandbox`]).
    #[cfg(test)]
    pub(crate) fn render_jinja(
        &self,
        source: &str,
        input: &ChatInput,
    ) -> Result<String, TemplateError> {
        sandbox::render_in_process(&self.job(source, input)).map_err(TemplateError::from)
    }
}

/// Whether a signal asked bmoe to stop.
fn signalled() -> Option<&'static str> {
    crate::interrupt::requested().map(|_| "a signal asked bmoe to stop")
}

/// The conversation up to the end of its last (assistant) message's text,
/// with no end of turn after it: rendered by `render` with a mark after that
/// text and cut at the mark, so the template writes the turn's opening as it
/// writes it for that message. A template that changes the text (the mark is
/// not there once) gets llama-server's way instead: the earlier messages with
/// the assistant's turn opened, then the text.
fn continuing(
    input: &ChatInput,
    render: impl Fn(&ChatInput) -> Result<Rendered, TemplateError>,
) -> Result<Rendered, TemplateError> {
    let Some((last, head)) = input.messages.split_last() else {
        return render(input);
    };
    let mut marked = input.messages.to_vec();
    if let Some(m) = marked.last_mut() {
        m.content.push_str(CONTINUE_MARK);
    }
    let closed = render(&ChatInput {
        messages: &marked,
        add_generation_prompt: false,
        ..*input
    })?;
    let marks: Vec<usize> = closed
        .text
        .match_indices(CONTINUE_MARK)
        .map(|(at, _)| at)
        .collect();
    if let [at] = marks[..] {
        return Ok(Rendered {
            text: closed.text[..at].to_string(),
            source: closed.source,
        });
    }
    let opened = render(&ChatInput {
        messages: head,
        add_generation_prompt: true,
        ..*input
    })?;
    Ok(Rendered {
        text: opened.text + &last.content,
        source: opened.source,
    })
}

/// What [`continuing`] writes after the text it continues
/// (private-use characters around a word: no template writes it).
const CONTINUE_MARK: &str = "\u{F8FF}bmoe:continue\u{F8FF}";

/// Whether the conversation ends in an assistant message to continue: one
/// with no tool calls (a turn that ended in calls is over).
fn continues_last(messages: &[Message]) -> bool {
    messages
        .last()
        .is_some_and(|m| m.role == "assistant" && !m.extra.contains_key("tool_calls"))
}

#[cfg(test)]
#[path = "template_tests.rs"]
mod tests;
