//! The names of the tools a request offers, checked alike on the OpenAI and
//! the Anthropic routes: what both APIs take, `^[a-zA-Z0-9_-]{1,N}$` (N 64
//! for OpenAI's functions, 128 for Anthropic's tools), each name once. A name
//! is written into the prompt and read back out of the model's calls, so
//! markup (`<tool_call>`), quotes, newlines or NUL in it would corrupt both,
//! and two tools of one name make a call ambiguous.

use std::collections::HashMap;

use serde_json::Value;

use super::json_in::kind;

/// OpenAI's longest function name.
pub(crate) const OPENAI_MAX_CHARS: usize = 64;
/// Anthropic's longest tool name.
pub(crate) const ANTHROPIC_MAX_CHARS: usize = 128;

/// The names seen so far in one request's tools.
pub(crate) struct ToolNames {
    max_chars: usize,
    /// Each name and the path of the tool that gave it.
    seen: HashMap<String, String>,
}

impl ToolNames {
    pub(crate) fn new(max_chars: usize) -> Self {
        debug_assert!(max_chars >= 1);
        Self {
            max_chars,
            seen: HashMap::new(),
        }
    }

    /// The name at `path` (a JSON value, if given) checked and taken, or a
    /// message naming the field and the fix.
    pub(crate) fn take(&mut self, path: &str, v: Option<&Value>) -> Result<String, String> {
        let rule = format!(
            "a tool name is 1 to {} letters, digits, _ or - (as OpenAI's and Anthropic's APIs take)",
            self.max_chars
        );
        let name = match v {
            Some(Value::String(s)) => s,
            None | Some(Value::Null) => return Err(format!("{path} is required: {rule}")),
            Some(v) => return Err(format!("{path} must be a string, not {}", kind(v))),
        };
        if name.is_empty() {
            return Err(format!("{path} is empty: {rule}"));
        }
        let chars = name.chars().count();
        if chars > self.max_chars {
            return Err(format!("{path} has {chars} characters: {rule}"));
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            return Err(format!("{path} {name:?} holds {c:?}: {rule}"));
        }
        if let Some(first) = self.seen.get(name) {
            return Err(format!(
                "{path} {name:?} is also {first}: give each tool its own name"
            ));
        }
        self.seen.insert(name.clone(), path.to_string());
        Ok(name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_are_what_both_apis_take_and_each_once() {
        let mut n = ToolNames::new(OPENAI_MAX_CHARS);
        let mut take = |path: &str, v: Value| n.take(path, Some(&v));
        assert_eq!(
            take("tools[0].name", json!("get_weather-2")).unwrap(),
            "get_weather-2"
        );
        let refused = |r: Result<String, String>, want: &str| {
            let m = r.unwrap_err();
            assert!(m.contains(want), "{m:?} lacks {want:?}");
            assert!(
                m.contains("letters, digits, _ or -") || m.contains("own name"),
                "{m}"
            );
        };
        refused(take("tools[1].name", json!("")), "tools[1].name is empty");
        for bad in [
            "<tool_call>",
            "a\"b",
            "a\nb",
            "a\0b",
            "a.b",
            "a:b",
            "a b",
            "é",
        ] {
            refused(take("tools[1].name", json!(bad)), "tools[1].name");
        }
        refused(
            take("tools[1].name", json!("x".repeat(65))),
            "65 characters",
        );
        refused(
            take("tools[2].name", json!("get_weather-2")),
            "is also tools[0].name",
        );
        let mut a = ToolNames::new(ANTHROPIC_MAX_CHARS);
        assert!(a
            .take("tools[0].name", Some(&json!("x".repeat(128))))
            .is_ok());
        assert!(a
            .take("tools[1].name", None)
            .unwrap_err()
            .contains("tools[1].name is required"));
        assert!(a
            .take("tools[1].name", Some(&json!(3)))
            .unwrap_err()
            .contains("must be a string, not a number"));
    }
}
