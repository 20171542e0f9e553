//! A multi-turn conversation: an optional system prompt and the turns so
//! far, with the oldest turns dropped when the context fills.

use serde::{Deserialize, Serialize};

use super::message::Message;

/// A transcript that [`Conversation::from_json`] cannot take back.
#[derive(Debug, thiserror::Error)]
pub enum TranscriptError {
    #[error("not a bmoe chat transcript ({0}): /save FILE writes one")]
    Format(#[from] serde_json::Error),
    #[error("message {index} has the role {role:?}: a transcript holds a system prompt first, then user and assistant messages, a user message first")]
    Role { index: usize, role: String },
}

/// A transcript as read back.
#[derive(Deserialize)]
struct Loaded {
    model: String,
    messages: Vec<LoadedMessage>,
}

#[derive(Deserialize)]
struct LoadedMessage {
    role: String,
    content: String,
}

#[derive(Debug, Clone, Default)]
pub struct Conversation {
    system: Option<String>,
    /// User and assistant messages in order (a user message opens each turn).
    turns: Vec<Message>,
}

#[derive(Serialize)]
struct Saved<'a> {
    model: &'a str,
    messages: Vec<SavedMessage<'a>>,
}

#[derive(Serialize)]
struct SavedMessage<'a> {
    role: &'a str,
    content: &'a str,
}

impl Conversation {
    pub fn new(system: Option<String>) -> Self {
        Self {
            system,
            turns: Vec::new(),
        }
    }

    /// Every message, the system prompt first.
    pub fn messages(&self) -> Vec<Message> {
        let system = self.system.iter().map(|s| Message::new("system", s));
        system.chain(self.turns.iter().cloned()).collect()
    }

    pub fn push(&mut self, role: &str, content: &str) {
        self.turns.push(Message::new(role, content));
    }

    /// Drop the last message (a user message whose turn failed).
    pub fn pop(&mut self) {
        self.turns.pop();
    }

    /// Drop the oldest turn (its user message and the replies up to the next
    /// user message); false when only the newest user message is left.
    pub fn drop_oldest_turn(&mut self) -> bool {
        let next_user = self.turns.iter().skip(1).position(|m| m.role == "user");
        match next_user {
            Some(i) => {
                self.turns.drain(..=i);
                true
            }
            None => false,
        }
    }

    /// Forget every turn (the system prompt stays).
    pub fn reset(&mut self) {
        self.turns.clear();
    }

    pub fn turns(&self) -> usize {
        self.turns.iter().filter(|m| m.role == "user").count()
    }

    /// A transcript [`Self::to_json`] wrote: the model it names and the
    /// conversation.
    pub fn from_json(json: &str) -> Result<(String, Self), TranscriptError> {
        let loaded: Loaded = serde_json::from_str(json)?;
        let mut messages = loaded.messages.into_iter().enumerate().peekable();
        let system = messages
            .next_if(|(_, m)| m.role == "system")
            .map(|(_, m)| m.content);
        let mut conversation = Self::new(system);
        for (index, m) in messages {
            let expected_user = conversation.turns.is_empty();
            let ok = match m.role.as_str() {
                "user" => true,
                "assistant" => !expected_user,
                _ => false,
            };
            if !ok {
                return Err(TranscriptError::Role {
                    index,
                    role: m.role,
                });
            }
            conversation.push(&m.role, &m.content);
        }
        Ok((loaded.model, conversation))
    }

    /// The transcript as JSON: `{"model": ..., "messages": [{role, content}]}`.
    pub fn to_json(&self, model: &str) -> String {
        let messages = self.messages();
        let saved = Saved {
            model,
            messages: messages
                .iter()
                .map(|m| SavedMessage {
                    role: &m.role,
                    content: &m.content,
                })
                .collect(),
        };
        serde_json::to_string_pretty(&saved).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_turns_go_first_and_the_system_prompt_stays() {
        let mut c = Conversation::new(Some("be brief".into()));
        c.push("user", "a");
        c.push("assistant", "1");
        c.push("user", "b");
        c.push("assistant", "2");
        c.push("user", "c");
        assert_eq!(c.turns(), 3);
        assert!(c.drop_oldest_turn());
        let roles: Vec<String> = c.messages().iter().map(|m| m.content.clone()).collect();
        assert_eq!(roles, ["be brief", "b", "2", "c"]);
        assert!(c.drop_oldest_turn());
        assert!(!c.drop_oldest_turn(), "the newest user message stays");
        assert_eq!(c.messages().len(), 2);
        let json: serde_json::Value = serde_json::from_str(&c.to_json("m")).unwrap();
        assert_eq!(json["messages"][1]["content"], "c");
        c.reset();
        assert_eq!(c.messages().len(), 1);
    }

    #[test]
    fn a_saved_transcript_reads_back_and_a_wrong_one_is_refused() {
        let mut c = Conversation::new(Some("be brief".into()));
        c.push("user", "a");
        c.push("assistant", "1");
        c.push("user", "b");
        let (model, back) = Conversation::from_json(&c.to_json("m.gguf")).unwrap();
        assert_eq!(model, "m.gguf");
        assert_eq!(back.messages(), c.messages());
        assert_eq!(back.turns(), 2);
        let no_system = r#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#;
        assert_eq!(Conversation::from_json(no_system).unwrap().1.turns(), 1);
        let reply_first = r#"{"model": "m", "messages": [{"role": "assistant", "content": "x"}]}"#;
        let e = Conversation::from_json(reply_first)
            .unwrap_err()
            .to_string();
        assert!(e.contains("message 0 has the role \"assistant\""), "{e}");
        let tool = r#"{"model": "m", "messages": [{"role": "user", "content": "x"},
            {"role": "tool", "content": "y"}]}"#;
        assert!(Conversation::from_json(tool).is_err());
        let e = Conversation::from_json("{}").unwrap_err().to_string();
        assert!(e.contains("not a bmoe chat transcript"), "{e}");
    }
}
