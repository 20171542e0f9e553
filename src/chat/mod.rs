//! Conversations: the chat template that turns messages into a prompt.

mod template;

pub use template::{ChatTemplate, TemplateError, TemplateOptions, TemplateSource};
