//! Calls still being written: the calls of a block whose closing marker has
//! not come yet, each with its name and its arguments so far, written as a
//! prefix of the JSON text the whole parse will give them (compact, keys in
//! the order written, as `serde_json` writes the whole object). A member
//! goes in once its value is whole; a string value grows as it is written,
//! so a long argument streams. Each format reads its calls so far with
//! these (`Syntax::open_calls`); a leaf beside `call.rs`.

use serde_json::{Map, Value};

use super::call::{json_call, ToolCall};

/// A call whose name is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Open {
    pub(crate) name: String,
    pub(crate) args: Args,
}

/// A call's arguments so far: `text` is a prefix of the whole arguments,
/// and `text` + `closing` a JSON object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Args {
    pub(crate) text: String,
    pub(crate) closing: &'static str,
}

impl Default for Args {
    /// None written yet.
    fn default() -> Self {
        Self {
            text: String::new(),
            closing: "{}",
        }
    }
}

impl Open {
    pub(crate) fn new(name: &str, args: Args) -> Self {
        Self {
            name: name.into(),
            args,
        }
    }

    /// A call already whole (its arguments are the whole parse's text).
    pub(crate) fn whole(c: &ToolCall) -> Self {
        let args = Args {
            text: c.arguments.clone(),
            closing: "",
        };
        Self::new(&c.name, args)
    }
}

/// Builds a call's arguments member by member.
#[derive(Debug, Default)]
pub(crate) struct ArgsSoFar {
    members: Map<String, Value>,
    /// A string member still being written: its key and its text so far.
    open: Option<(String, String)>,
    /// Whether the object's `}` came.
    closed: bool,
}

impl ArgsSoFar {
    /// A whole member; false (and nothing taken) for a key seen before,
    /// whose place in the whole object would not be where it is written.
    pub(crate) fn member(&mut self, key: &str, value: Value) -> bool {
        if self.members.contains_key(key) {
            return false;
        }
        self.members.insert(key.into(), value);
        true
    }

    /// A string member still being written.
    pub(crate) fn open_string(&mut self, key: &str, so_far: &str) {
        if !self.members.contains_key(key) {
            self.open = Some((key.into(), so_far.into()));
        }
    }

    /// The arguments as written so far.
    pub(crate) fn args(&self) -> Args {
        let mut text = Value::Object(self.members.clone()).to_string();
        if self.closed {
            return Args { text, closing: "" };
        }
        text.pop();
        let Some((key, so_far)) = &self.open else {
            return Args { text, closing: "}" };
        };
        if !self.members.is_empty() {
            text.push(',');
        }
        text.push_str(&Value::String(key.clone()).to_string());
        text.push(':');
        let value = Value::String(so_far.clone()).to_string();
        text.push_str(&value[..value.len() - 1]);
        Args {
            text,
            closing: "\"}",
        }
    }
}

/// Arguments already whole: an object (anything else is left to the whole
/// parse).
pub(crate) fn whole_args(v: &Value) -> Args {
    match v {
        Value::Object(_) => Args {
            text: v.to_string(),
            closing: "",
        },
        _ => Args::default(),
    }
}

/// What follows a member's `:` when its value is not whole yet.
#[derive(Debug, Default)]
enum Tail<'a> {
    #[default]
    None,
    /// A value other than a string: its raw text so far.
    Raw(String, &'a str),
}

/// A JSON object read as far as it is written: its whole members (a string
/// member still being written among them as open), and the raw text of a
/// member of another kind still being written.
fn scan_object(raw: &str) -> Option<(ArgsSoFar, Tail<'_>)> {
    let mut rest = raw.trim_start().strip_prefix('{')?;
    let mut args = ArgsSoFar::default();
    loop {
        rest = rest.trim_start();
        if rest.starts_with('}') {
            args.closed = true;
            return Some((args, Tail::None));
        }
        let Some((key, after)) = whole_string(rest) else {
            return Some((args, Tail::None));
        };
        let Some(v) = after.trim_start().strip_prefix(':') else {
            return Some((args, Tail::None));
        };
        let v = v.trim_start();
        match whole_value(v) {
            Some((value, after)) => {
                if !args.member(&key, value) {
                    return Some((args, Tail::None));
                }
                rest = after.trim_start();
            }
            None if v.starts_with('"') => {
                args.open_string(&key, &string_prefix(&v[1..]));
                return Some((args, Tail::None));
            }
            None if v.is_empty() => return Some((args, Tail::None)),
            None => return Some((args, Tail::Raw(key, v))),
        }
        match rest.strip_prefix(',') {
            Some(r) => rest = r,
            None if rest.starts_with('}') => {}
            None => return Some((args, Tail::None)),
        }
    }
}

/// A call's arguments from their raw JSON text so far.
pub(crate) fn json_args_so_far(raw: &str) -> Args {
    scan_object(raw).map_or_else(Args::default, |(a, _)| a.args())
}

/// A JSON value that is whole and followed by more text (a number at the
/// very end may go on), and the text after it.
fn whole_value(v: &str) -> Option<(Value, &str)> {
    let mut values = serde_json::Deserializer::from_str(v).into_iter::<Value>();
    let value = values.next()?.ok()?;
    let end = values.byte_offset();
    (end < v.len()).then(|| (value, &v[end..]))
}

/// A whole JSON string at the start of `s`, decoded, and the text after it.
fn whole_string(s: &str) -> Option<(String, &str)> {
    let b = s.as_bytes();
    if b.first() != Some(&b'"') {
        return None;
    }
    let mut i = 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some((serde_json::from_str(&s[..=i]).ok()?, &s[i + 1..])),
            _ => i += 1,
        }
    }
    None
}

/// The text of a JSON string whose closing quote has not come (`raw`: after
/// its opening quote), less an escape cut in the middle.
fn string_prefix(raw: &str) -> String {
    (raw.len().saturating_sub(12)..=raw.len())
        .rev()
        .filter(|&cut| raw.is_char_boundary(cut))
        .find_map(|cut| serde_json::from_str::<String>(&format!("\"{}\"", &raw[..cut])).ok())
        .unwrap_or_default()
}

/// Hermes's `{"name": .., "arguments": {..` so far: a call once its name is
/// whole.
pub(crate) fn hermes(block: &str) -> Option<Open> {
    let (outer, tail) = scan_object(block)?;
    let name = outer
        .members
        .get("name")?
        .as_str()
        .filter(|n| !n.is_empty())?;
    let is_args = |k: &str| k == "arguments" || k == "parameters";
    let args = match (outer.members.iter().find(|(k, _)| is_args(k)), tail) {
        (Some((_, v)), _) => whole_args(v),
        (None, Tail::Raw(k, raw)) if is_args(&k) => json_args_so_far(raw),
        _ => Args::default(),
    };
    Some(Open::new(name, args))
}

/// A JSON list of Hermes-shaped calls so far (a lone object too).
pub(crate) fn list(block: &str) -> Vec<Open> {
    let mut out = Vec::new();
    let block = block.trim_start();
    let Some(mut rest) = block.strip_prefix('[') else {
        return hermes(block).into_iter().collect();
    };
    loop {
        rest = rest.trim_start();
        match whole_value(rest) {
            Some((v, after)) => match json_call(&v) {
                Some(c) => {
                    out.push(Open::whole(&c));
                    rest = after.trim_start();
                }
                None => return out,
            },
            None => {
                out.extend(hermes(rest));
                return out;
            }
        }
        match rest.strip_prefix(',') {
            Some(r) => rest = r,
            None => return out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(raw: &str) -> (String, &'static str) {
        let a = json_args_so_far(raw);
        (a.text, a.closing)
    }

    /// Every prefix of an object gives a prefix of its compact text, and
    /// the prefix with its closing is JSON.
    #[test]
    fn every_prefix_of_an_object_is_a_prefix_of_its_whole_text() {
        let raw = r#" { "city" : "Pa\"ris \u00e9\ud83d\ude00", "days": 12, "tags": ["a", {"b": null}], "x": true } "#;
        let whole = serde_json::from_str::<Value>(raw).unwrap().to_string();
        let mut last = String::new();
        for cut in (0..=raw.len()).filter(|&c| raw.is_char_boundary(c)) {
            let (t, closing) = text(&raw[..cut]);
            assert!(whole.starts_with(&t), "{cut}: {t:?} of {whole:?}");
            if !t.is_empty() {
                let v: Value = serde_json::from_str(&format!("{t}{closing}"))
                    .unwrap_or_else(|e| panic!("{cut}: {t:?}{closing}: {e}"));
                assert!(v.is_object());
            }
            assert!(t.starts_with(&last), "{cut}: {t:?} after {last:?}");
            last = t;
        }
        assert_eq!(text(raw), (whole, ""));
        assert_eq!(text(r#"{"city": "Par"#).0, r#"{"city":"Par"#);
        assert_eq!(text(r#"{"days": 12"#).0, "{", "a number may go on");
        assert_eq!(text(r#"{"days": 12,"#).0, r#"{"days":12"#);
        assert_eq!(text("[1]").0, "");
    }

    #[test]
    fn a_hermes_call_has_its_name_once_it_is_whole() {
        assert_eq!(hermes(r#"{"name": "get_wea"#), None);
        let o = hermes(r#"{"name": "get_weather", "arguments": {"city": "Os"#).unwrap();
        assert_eq!(o.name, "get_weather");
        assert_eq!(o.args.text, r#"{"city":"Os"#);
        let o = hermes(r#"{"name": "f", "arguments": {"a": 1}}"#).unwrap();
        assert_eq!((o.args.text.as_str(), o.args.closing), (r#"{"a":1}"#, ""));
        let two = list(r#"[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"k": "#);
        let names: Vec<_> = two.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["f", "g"]);
        assert_eq!(two[1].args.text, "{");
    }

    #[test]
    fn a_key_written_twice_ends_the_arguments_so_far_there() {
        assert_eq!(
            text(r#"{"a": 1, "b": 2, "a": 3, "c": 4}"#).0,
            r#"{"a":1,"b":2"#
        );
    }
}
