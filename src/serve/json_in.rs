//! The one way a request body is read, for every dialect: serde types
//! through `serde_path_to_error` (the body read once into a
//! `serde_json::Value`), every refusal in the request's own terms: the field
//! at fault by its path (`messages[2].content`, its top-level field the
//! error's `param`), and serde's Rust words (`expected struct ChatRequest`,
//! `expected i64`, `sequence`) said in JSON's (`expected an object`,
//! `expected an integer`, `array`). The field types [`Num`], [`Int`],
//! [`Flag`] and [`Text`] refuse in plain words instead (`temperature must be
//! a number, not a string`); [`field`] and [`required`] read one field of an
//! object a dialect walks by hand (a list of blocks of several kinds).

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::ApiError;

/// Fields of several shapes, which serde names by their Rust type
/// ("untagged enum PromptIn"): what to say instead.
const SHAPES: [(&str, &str); 2] = [
    (
        "PromptIn",
        "prompt must be a string (or a list of one string)",
    ),
    ("StopIn", "stop must be a string or a list of strings"),
];

/// The body as JSON: a 400 with serde_json's line and column when it is not
/// JSON, or not an object.
pub(crate) fn body(bytes: &[u8]) -> Result<Value, ApiError> {
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| ApiError::body(format!("invalid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::body(format!(
            "the body must be a JSON object, not {}",
            kind(&v)
        )));
    }
    Ok(v)
}

/// `v` (the whole body) read as `T`; a refusal names the field's path
/// and says what was expected in JSON's words.
pub(crate) fn read<T: DeserializeOwned>(v: &Value) -> Result<T, ApiError> {
    read_at(v, "")
}

/// `v`, found at `path` in the body, read as `T` (see [`read`]). A field
/// type of this file ([`Num`], [`Int`], [`Flag`], [`Text`]) refuses in
/// plain words after the path (`temperature must be a number, not a
/// string`); serde's own refusals are said after it and a colon.
pub(crate) fn read_at<T: DeserializeOwned>(v: &Value, path: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = join(path, &e.path().to_string());
        let message = e.inner().to_string();
        match message.strip_prefix(PLAIN) {
            Some(plain) => ApiError::at(&path, format!("{path} {plain}")),
            None => ApiError::at(&path, format!("invalid request: {}", say(&path, &message))),
        }
    })
}

/// The field `key` of the object at `path`, read as `T`; None when absent
/// or null.
pub(crate) fn field<T: DeserializeOwned>(
    o: &Obj,
    key: &str,
    path: &str,
) -> Result<Option<T>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => read_at(v, &join(path, key)).map(Some),
    }
}

/// As [`field`], for a field that must be given.
pub(crate) fn required<T: DeserializeOwned>(o: &Obj, key: &str, path: &str) -> Result<T, ApiError> {
    field(o, key, path)?.ok_or_else(|| {
        let at = join(path, key);
        ApiError::at(&at, format!("{at} is required"))
    })
}

/// The string field `key` of the object at `path`, borrowed; refused as
/// [`required`] refuses a [`Text`].
pub(crate) fn string<'a>(o: &'a Obj, key: &str, path: &str) -> Result<&'a str, ApiError> {
    if let Some(Value::String(s)) = o.get(key) {
        return Ok(s);
    }
    match required::<Text>(o, key, path) {
        Err(e) => Err(e),
        Ok(_) => unreachable!("a string field that is not a string"),
    }
}

/// The value at `path` as an object, or a refusal naming it.
pub(crate) fn object<'a>(v: &'a Value, path: &str) -> Result<&'a Obj, ApiError> {
    v.as_object()
        .ok_or_else(|| ApiError::at(path, format!("{path} must be an object, not {}", kind(v))))
}

/// A JSON object.
pub(crate) type Obj = serde_json::Map<String, Value>;

/// `path` and a path `rel` below it (`.` or empty: `path` itself).
fn join(path: &str, rel: &str) -> String {
    match (path, rel) {
        (p, "." | "") => p.to_string(),
        ("", r) => r.to_string(),
        (p, r) if r.starts_with('[') => format!("{p}{r}"),
        (p, r) => format!("{p}.{r}"),
    }
}

/// The mark of a refusal in plain words (it follows the field's path).
const PLAIN: &str = "\u{1}";

/// Field types that refuse in plain words: `NAME must be WHAT, not KIND`.
macro_rules! plain_field {
    ($(#[$doc:meta])* $name:ident($ty:ty), $what:literal, $take:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq)]
        pub(crate) struct $name(pub(crate) $ty);

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let v = <Value as serde::Deserialize>::deserialize(d)?;
                let take: fn(&Value) -> Option<$ty> = $take;
                take(&v).map($name).ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "{PLAIN}must be {}, not {}",
                        $what,
                        kind(&v)
                    ))
                })
            }
        }
    };
}

plain_field!(
    /// A number (as f32).
    Num(f32),
    "a number",
    |v| v.as_f64().map(|x| x as f32)
);
plain_field!(
    /// A whole number.
    Int(i64),
    "a whole number",
    Value::as_i64
);
plain_field!(
    /// true or false.
    Flag(bool),
    "true or false",
    Value::as_bool
);
plain_field!(
    /// A string.
    Text(String),
    "a string",
    |v| v.as_str().map(str::to_string)
);

/// A list, refused in plain words when the value is not one (`NAME must be
/// an array, not KIND`); its items are read with their paths.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct List<T>(pub(crate) Vec<T>);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for List<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ListVisitor(std::marker::PhantomData))
    }
}

struct ListVisitor<T>(std::marker::PhantomData<T>);

/// The refusal of a value of `kind` where a list belongs.
fn not_a_list<E: serde::de::Error>(kind: &str) -> E {
    E::custom(format!("{PLAIN}must be an array, not {kind}"))
}

impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for ListVisitor<T> {
    type Value = List<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<List<T>, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element()? {
            out.push(item);
        }
        Ok(List(out))
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<List<T>, E> {
        Err(not_a_list("a boolean"))
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<List<T>, E> {
        Err(not_a_list("a number"))
    }

    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<List<T>, E> {
        Err(not_a_list("a number"))
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<List<T>, E> {
        Err(not_a_list("a number"))
    }

    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<List<T>, E> {
        Err(not_a_list("a string"))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<List<T>, A::Error> {
        Err(not_a_list("an object"))
    }
}

/// serde's message about the field at `path`, in the request's terms.
fn say(path: &str, serde_message: &str) -> String {
    for (ty, words) in SHAPES {
        if serde_message.contains(&format!("untagged enum {ty}")) {
            return words.to_string();
        }
    }
    let words = in_json_words(serde_message);
    if path.is_empty() || path == "." {
        words
    } else {
        format!("{path}: {words}")
    }
}

/// serde's Rust words for types and values replaced by JSON's.
pub(crate) fn in_json_words(serde_message: &str) -> String {
    let mut out = serde_message.to_string();
    if let Some(at) = out.find("expected struct ") {
        let name_end = out[at + "expected struct ".len()..]
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(out.len(), |i| at + "expected struct ".len() + i);
        out.replace_range(at..name_end, "expected an object");
    }
    const WORDS: [(&str, &str); 8] = [
        ("invalid type: sequence", "invalid type: array"),
        ("invalid type: map", "invalid type: object"),
        ("unit value", "null"),
        ("floating point", "number"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected an object"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
    ];
    for (rust, json) in WORDS {
        out = out.replace(rust, json);
    }
    for int in [
        "i64", "u64", "i32", "u32", "i16", "u16", "i8", "u8", "usize", "isize",
    ] {
        // No name here is the start of another ("i64" before "i8").
        out = out.replace(&format!("expected {int}"), "expected an integer");
    }
    out
}

/// What kind of JSON value a refusal names ("an object").
pub(crate) fn kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_words_become_json_words() {
        for (serde, plain) in [
            (
                "invalid type: sequence, expected struct CompletionRequest",
                "invalid type: array, expected an object",
            ),
            (
                "invalid type: string \"x\", expected i64",
                "invalid type: string \"x\", expected an integer",
            ),
            (
                "invalid type: floating point `1.5`, expected u32",
                "invalid type: number `1.5`, expected an integer",
            ),
            (
                "invalid type: integer `3`, expected a sequence",
                "invalid type: integer `3`, expected an array",
            ),
            (
                "invalid type: map, expected f32",
                "invalid type: object, expected a number",
            ),
            ("missing field `role`", "missing field `role`"),
        ] {
            assert_eq!(in_json_words(serde), plain);
        }
    }

    #[test]
    fn a_refusal_names_the_path_and_its_field() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Inner {
            max_tokens: Option<i64>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Outer {
            messages: Vec<Inner>,
        }
        let v = body(br#"{"messages": [{"max_tokens": 1}, {"max_tokens": "x"}]}"#).unwrap();
        let e = read::<Outer>(&v).unwrap_err();
        assert_eq!(e.param(), Some("messages"));
        assert_eq!(
            e.message,
            "invalid request: messages[1].max_tokens: invalid type: string \"x\", expected an integer"
        );
        let e = body(b"[1]").unwrap_err();
        assert_eq!(e.message, "the body must be a JSON object, not an array");
        assert!(body(b"{").unwrap_err().message.starts_with("invalid JSON"));
    }

    #[test]
    fn plain_fields_say_the_path_then_the_rule() {
        use serde_json::json;
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct B {
            t: Option<Num>,
            s: Option<Flag>,
            inner: Option<Vec<Item>>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Item {
            n: Int,
        }
        let e = read::<B>(&body(br#"{"t": "hot"}"#).unwrap()).unwrap_err();
        assert_eq!(e.message, "t must be a number, not a string");
        assert_eq!(e.param(), Some("t"));
        let e = read::<B>(&body(br#"{"inner": [{"n": 1}, {"n": 1.5}]}"#).unwrap()).unwrap_err();
        assert_eq!(e.message, "inner[1].n must be a whole number, not a number");
        assert_eq!(e.param(), Some("inner"));
        let o = body(br#"{"a": {"b": "x", "c": null}}"#).unwrap();
        let a = object(&o["a"], "a").unwrap();
        assert_eq!(field::<Text>(a, "b", "a").unwrap(), Some(Text("x".into())));
        assert_eq!(field::<Text>(a, "c", "a").unwrap(), None);
        let e = required::<Text>(a, "c", "a").unwrap_err();
        assert_eq!(
            (e.message.as_str(), e.param()),
            ("a.c is required", Some("a"))
        );
        let e = field::<Flag>(a, "b", "a").unwrap_err();
        assert_eq!(e.message, "a.b must be true or false, not a string");
        let e = read_at::<List<Text>>(&json!("x"), "stop").unwrap_err();
        assert_eq!(e.message, "stop must be an array, not a string");
        let e = read_at::<List<Text>>(&json!(["x", 3]), "stop").unwrap_err();
        assert_eq!(e.message, "stop[1] must be a string, not a number");
        let e = object(&o["a"]["b"], "a.b").unwrap_err();
        assert_eq!(e.message, "a.b must be an object, not a string");
    }
}
