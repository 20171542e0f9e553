//! One message of a conversation as chat templates read it.

use serde::{Deserialize, Serialize};

/// A message: its role and text, and any other fields a client or a
/// conversation gives (`tool_calls`, `tool_call_id`, `name`,
/// `reasoning_content`, ...), passed to the template as they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            extra: serde_json::Map::new(),
        }
    }
}
