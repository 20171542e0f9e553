//! A job's prompt as the engine takes it: a chat rendered through the
//! template (stopped when its request goes away) or a text prompt, tokenized;
//! the errors each failure is answered with.

use axum::http::StatusCode;

use super::error::ApiError;
use super::job::PromptSpec;
use super::metrics as m;
use crate::chat::{ChatInput, ChatTemplate, TemplateError};
use crate::engine::Session;
use crate::llama::Token;

/// The job's prompt tokens, a note on how a chat was rendered when it
/// was not the model's own template, and whether the rendered prompt ends
/// inside a reasoning block (`<think>`: the reply starts with reasoning).
pub(super) fn prompt_of(
    session: &Session,
    template: &ChatTemplate,
    prompt: &PromptSpec,
    cancelled: &dyn Fn() -> Option<&'static str>,
) -> Result<(Vec<Token>, Vec<String>, bool), ApiError> {
    let model = session.model();
    let bad = |e: String| ApiError::invalid(Some("messages"), e);
    let (tokens, notes, open) = match prompt {
        PromptSpec::Chat {
            messages,
            tools,
            options,
        } => {
            let input = ChatInput {
                messages,
                tools: tools.as_ref(),
                options,
                add_generation_prompt: true,
            };
            let rendered =
                template
                    .render_until(model, &input, cancelled)
                    .map_err(|e| match e {
                        TemplateError::Cancelled(why) => {
                            m::cancelled();
                            ApiError::new(StatusCode::BAD_REQUEST, "cancelled", why.to_string())
                        }
                        e if e.is_bad_input() => bad(e.to_string()),
                        e => ApiError::server(&e.to_string()),
                    })?;
            let notes = rendered.note().into_iter().collect();
            let open = crate::chat::reasoning::prompt_opens(&rendered.text);
            (
                template
                    .tokens(model, &rendered)
                    .map_err(|e| bad(e.to_string()))?,
                notes,
                open,
            )
        }
        PromptSpec::Text(text) => (
            model
                .tokenize(text, true, false)
                .map_err(|e| ApiError::invalid(Some("prompt"), e.to_string()))?,
            Vec::new(),
            false,
        ),
    };
    if tokens.is_empty() {
        return Err(ApiError::body("the prompt is empty after tokenization"));
    }
    Ok((tokens, notes, open))
}
