//! A multi-turn conversation: an optional system prompt and the turns so
//! far, with the oldest turns dropped when the context fills.

use serde::Serialize;

use super::Message;

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
}
