//! Conversations: the turns so far, and the chat template that turns them
//! into a prompt.

mod conversation;
mod template;

pub use conversation::Conversation;

pub use template::{ChatTemplate, TemplateError, TemplateOptions, TemplateSource};
