//! Conversations: the turns so far, and the chat template that turns them
//! into a prompt.

#[cfg(test)]
mod conformance;
mod conversation;
mod jinja;
mod message;
pub mod reasoning;
pub mod sandbox;
mod template;
pub mod tool_calls;
pub mod tool_grammar;
mod tool_prompt;

pub use conversation::{Conversation, TranscriptError};
pub use message::Message;

pub use template::{
    ChatInput, ChatTemplate, Rendered, TemplateError, TemplateOptions, TemplateSource,
};
