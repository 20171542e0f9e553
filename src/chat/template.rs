//! A conversation as prompt text: the model's own `tokenizer.chat_template`
//! (Jinja, rendered with minijinja and its Python-compatible methods), else
//! llama.cpp's built-in matcher for well-known templates.

use serde::Serialize;

use crate::llama::{ChatMessage, Model};

/// Errors rendering a conversation.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("the model has no chat template (tokenizer.chat_template) and llama.cpp knows none for it: use a completion (a plain prompt) instead")]
    NoTemplate,
    #[error("the model's chat template failed ({jinja}) and llama.cpp's built-in matcher did too ({builtin})")]
    Failed { jinja: String, builtin: String },
}

/// Which renderer produced the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateSource {
    /// The gguf's own Jinja template.
    Jinja,
    /// llama.cpp's built-in matcher (the Jinja template could not be rendered).
    Builtin,
}

impl TemplateSource {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            TemplateSource::Jinja => "the model's own Jinja chat template (minijinja)",
            TemplateSource::Builtin => "llama.cpp's built-in template for this model",
        }
    }
}

/// A model's chat template, ready to render conversations.
pub struct ChatTemplate {
    /// The Jinja source (None: the model carries none).
    source: Option<String>,
    bos: String,
    eos: String,
}

/// Template options beyond the messages (such as a reasoning switch, which
/// templates read as `enable_thinking` or similar): name and JSON value.
pub type TemplateOptions = serde_json::Map<String, serde_json::Value>;

#[derive(Serialize)]
struct Message<'a> {
    role: &'a str,
    content: &'a str,
}

impl ChatTemplate {
    pub fn of(model: &Model) -> Self {
        let (bos, eos) = model.bos_eos_text();
        Self {
            source: model.chat_template(),
            bos,
            eos,
        }
    }

    /// `messages` as prompt text with the assistant's turn opened, and which
    /// renderer made it (the Jinja template first, llama.cpp's built-in one
    /// when that fails).
    pub fn render(
        &self,
        model: &Model,
        messages: &[ChatMessage],
        options: &TemplateOptions,
    ) -> Result<(String, TemplateSource), TemplateError> {
        let Some(source) = self.source.as_deref() else {
            return Err(TemplateError::NoTemplate);
        };
        let jinja = match self.render_jinja(source, messages, options) {
            Ok(text) => return Ok((text, TemplateSource::Jinja)),
            Err(e) => e,
        };
        tracing::debug!("chat template: minijinja failed ({jinja}); trying llama.cpp's matcher");
        match model.apply_chat_template(messages) {
            Ok(text) => Ok((text, TemplateSource::Builtin)),
            Err(e) => Err(TemplateError::Failed {
                jinja,
                builtin: e.to_string(),
            }),
        }
    }

    /// The Jinja template rendered as Hugging Face's tokenizers do: the
    /// messages, `add_generation_prompt`, the bos/eos token texts and the options.
    fn render_jinja(
        &self,
        source: &str,
        messages: &[ChatMessage],
        options: &TemplateOptions,
    ) -> Result<String, String> {
        let mut env = minijinja::Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template("chat", source)
            .map_err(|e| e.to_string())?;
        let msgs: Vec<Message> = messages
            .iter()
            .map(|m| Message {
                role: &m.role,
                content: &m.content,
            })
            .collect();
        let mut vars = options.clone();
        let mut set = |k: &str, v: serde_json::Value| vars.insert(k.into(), v);
        set("messages", serde_json::json!(msgs));
        set("add_generation_prompt", true.into());
        set("bos_token", self.bos.clone().into());
        set("eos_token", self.eos.clone().into());
        let tmpl = env.get_template("chat").map_err(|e| e.to_string())?;
        tmpl.render(minijinja::Value::from_serialize(&vars))
            .map_err(|e| e.to_string())
    }
}

/// Templates call `raise_exception("...")` to reject a conversation.
fn raise_exception(msg: String) -> Result<minijinja::Value, minijinja::Error> {
    Err(minijinja::Error::new(
        minijinja::ErrorKind::InvalidOperation,
        msg,
    ))
}

/// Some templates print today's date (UTC, strftime's format; an invalid
/// format is an error, not a panic).
fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Utc::now().format(&format)).map_err(|_| {
        minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        )
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(src: &str) -> ChatTemplate {
        ChatTemplate {
            source: Some(src.into()),
            bos: "<s>".into(),
            eos: "</s>".into(),
        }
    }

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn renders_messages_options_and_python_methods() {
        let t = template(
            "{{ bos_token }}{% for m in messages %}[{{ m.role.upper() }}] {{ m.content.strip() }}\n{% endfor %}\
             {% if add_generation_prompt %}[ASSISTANT]{% endif %}{% if enable_thinking %} think{% endif %}",
        );
        let mut opts = TemplateOptions::new();
        opts.insert("enable_thinking".into(), true.into());
        let out = t
            .render_jinja(
                t.source.as_deref().unwrap(),
                &[msg("system", " be brief "), msg("user", "hi")],
                &opts,
            )
            .unwrap();
        assert_eq!(out, "<s>[SYSTEM] be brief\n[USER] hi\n[ASSISTANT] think");
    }

    #[test]
    fn raise_exception_is_an_error_with_its_message() {
        let t = template("{{ raise_exception('only user and assistant roles') }}");
        let e = t
            .render_jinja(t.source.as_deref().unwrap(), &[], &TemplateOptions::new())
            .unwrap_err();
        assert!(e.contains("only user and assistant roles"), "{e}");
    }
}
