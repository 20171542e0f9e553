//! The Jinja environment chat templates are written for: Python jinja2 as
//! Hugging Face transformers' `apply_chat_template` configures it (sandboxed,
//! `trim_blocks` and `lstrip_blocks`, loop controls, the `{% generation %}`
//! tag, `raise_exception`, `strftime_now`, a `tojson` that is Python's
//! `json.dumps`), built on minijinja with the differences from jinja2 that
//! real templates meet made up for here: Python's spelling of values
//! (`None`, `True`, `['a']`), string literals continued with a backslash at a
//! line end, and the generation tag minijinja does not know.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

/// A day and time for `strftime_now` (UTC).
pub(crate) type Now = chrono::DateTime<chrono::Utc>;

/// An environment holding `source` as the template "chat", a render of which
/// may take `fuel` steps.
pub(crate) fn environment(
    source: &str,
    now: Option<Now>,
    fuel: u64,
) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_fuel(Some(fuel));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(|out, _state, value| {
        out.write_str(&python_str(value))
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "writing the prompt"))
    });
    env.add_filter("string", |v: Value| python_str(&v));
    env.add_filter("tojson", tojson);
    env.add_test("iterable", is_iterable);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", move |format: String| {
        strftime_now(now, &format)
    });
    env.add_template_owned("chat", preprocess(source))?;
    Ok(env)
}

/// The source as minijinja reads it the way jinja2 reads the original.
pub(crate) fn preprocess(source: &str) -> String {
    generation_tags(&join_continued_strings(source))
}

/// jinja2 decodes string literals with Python's `unicode-escape`, where a
/// backslash before a newline continues the line (both are dropped);
/// minijinja keeps them. Drop them inside the string literals of tags.
fn join_continued_strings(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut chars = source.chars().peekable();
    let mut in_tag = false;
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        let next = chars.peek().copied();
        match (in_tag, quote) {
            (false, _) if c == '{' && matches!(next, Some('{' | '%')) => {
                in_tag = true;
                out.push(c);
                out.extend(chars.next());
                continue;
            }
            (true, None) if matches!(c, '}' | '%') && next == Some('}') => {
                in_tag = false;
                out.push(c);
                out.extend(chars.next());
                continue;
            }
            (true, None) if c == '"' || c == '\'' => quote = Some(c),
            (true, Some(q)) if c == q => quote = None,
            (true, Some(_)) if c == '\\' => {
                match next {
                    Some('\n') => {
                        chars.next();
                    }
                    Some(n) => {
                        out.push(c);
                        out.push(n);
                        chars.next();
                    }
                    None => out.push(c),
                }
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    out
}

/// `{% generation %}` marks the assistant's part for training masks and
/// renders its body unchanged: an `if true` block does the same in
/// minijinja, whitespace control included.
fn generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body, trail) = trim_markers(inner);
        match body.trim() {
            "generation" => write!(out, "{{%{lead} if true {trail}%}}"),
            "endgeneration" => write!(out, "{{%{lead} endif {trail}%}}"),
            _ => write!(out, "{}", &tag[..end + 2]),
        }
        .expect("writing to a String");
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// A tag's inside split into its whitespace-control markers and the rest.
fn trim_markers(inner: &str) -> (&str, &str, &str) {
    let lead_len = usize::from(inner.starts_with(['-', '+']));
    let trail_len = usize::from(inner.len() > lead_len && inner.ends_with(['-', '+']));
    (
        &inner[..lead_len],
        &inner[lead_len..inner.len() - trail_len],
        &inner[inner.len() - trail_len..],
    )
}

/// jinja2's `iterable`: what Python can iterate (never `none`, which
/// minijinja iterates as empty).
fn is_iterable(v: &Value) -> bool {
    matches!(
        v.kind(),
        ValueKind::Seq
            | ValueKind::Map
            | ValueKind::String
            | ValueKind::Iterable
            | ValueKind::Bytes
    )
}

/// A value as Python's `str()` writes it: strings bare, the rest as `repr`.
fn python_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        _ => python_repr(v),
    }
}

/// A value as Python's `repr()` writes it (`None`, `True`, `'a'`, `[1, 2]`,
/// `{'k': 'v'}`).
fn python_repr(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => "None".into(),
        ValueKind::Bool if v.is_true() => "True".into(),
        ValueKind::Bool => "False".into(),
        ValueKind::String => repr_str(v.as_str().unwrap_or_default()),
        ValueKind::Number => python_number(v),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<String> = v
                .try_iter()
                .map(|it| it.map(|x| python_repr(&x)).collect())
                .unwrap_or_default();
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let items: Vec<String> = map_items(v)
                .iter()
                .map(|(k, x)| format!("{}: {}", python_repr(k), python_repr(x)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        _ => v.to_string(),
    }
}

/// Python's `repr` of a string: single quotes unless the text has one and
/// no double quote.
fn repr_str(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                write!(out, "\\x{:02x}", c as u32).expect("writing to a String")
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// Python writes a float with a fractional part even when it is whole.
fn python_number(v: &Value) -> String {
    let text = v.to_string();
    let is_float = f64::try_from(v.clone()).is_ok() && v.as_i64().is_none();
    if is_float && !text.contains(['.', 'e', 'E', 'n', 'N', 'i']) {
        format!("{text}.0")
    } else {
        text
    }
}

fn map_items(v: &Value) -> Vec<(Value, Value)> {
    v.try_iter()
        .map(|keys| {
            keys.map(|k| {
                let x = v.get_item(&k).unwrap_or_default();
                (k, x)
            })
            .collect()
        })
        .unwrap_or_default()
}

/// The brackets around a JSON container.
#[derive(Debug, Clone, Copy)]
struct Brackets {
    open: char,
    close: char,
}

impl Brackets {
    const LIST: Brackets = Brackets {
        open: '[',
        close: ']',
    };
    const MAP: Brackets = Brackets {
        open: '{',
        close: '}',
    };
}

/// `tojson` as transformers defines it: Python's `json.dumps` with
/// `ensure_ascii=False` (its `indent`, `separators` and `sort_keys` taken).
fn tojson(v: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(i) if i.is_none() => None,
        Some(i) => Some(match i.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(i.as_usize().unwrap_or(0)),
        }),
    };
    let (item, key) = match separators.filter(|s| !s.is_none()) {
        Some(s) => (
            s.get_item_by_index(0)?.as_str().unwrap_or(",").to_string(),
            s.get_item_by_index(1)?.as_str().unwrap_or(":").to_string(),
        ),
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = JsonStyle {
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(&mut out, &v, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonStyle {
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
}

impl JsonStyle {
    fn write(&self, out: &mut String, v: &Value, level: usize) -> Result<(), Error> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&python_number(v)),
            ValueKind::String => json_str(out, v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container(out, Brackets::LIST, items.len(), level, |out, i| {
                    self.write(out, &items[i], level + 1)
                })?;
            }
            ValueKind::Map => {
                let mut items = map_items(v);
                if self.sort_keys {
                    items.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(out, Brackets::MAP, items.len(), level, |out, i| {
                    let (k, x) = &items[i];
                    json_str(out, &python_str(k));
                    out.push_str(&self.key);
                    self.write(out, x, level + 1)
                })?;
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a {} cannot be written as JSON", v.kind()),
                ))
            }
        }
        Ok(())
    }

    fn container(
        &self,
        out: &mut String,
        brackets: Brackets,
        n: usize,
        level: usize,
        mut each: impl FnMut(&mut String, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let Brackets { open, close } = brackets;
        out.push(open);
        if n == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..n {
            if i > 0 {
                out.push_str(&self.item);
            }
            if let Some(ind) = &self.indent {
                out.push('\n');
                out.push_str(&ind.repeat(level + 1));
            }
            each(out, i)?;
        }
        if let Some(ind) = &self.indent {
            out.push('\n');
            out.push_str(&ind.repeat(level));
        }
        out.push(close);
        Ok(())
    }
}

/// A JSON string as Python writes it with `ensure_ascii=False` (serde_json
/// escapes the same characters the same way: quote, backslash, the short
/// forms of \b \f \n \r \t, other controls as lowercase `\u00XX`).
fn json_str(out: &mut String, s: &str) {
    out.push_str(&serde_json::Value::from(s).to_string());
}

/// Templates call `raise_exception("...")` to reject a conversation.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// Today's date and time (UTC) in strftime's `format`; an invalid format is
/// an error, not a panic.
fn strftime_now(now: Option<Now>, format: &str) -> Result<String, Error> {
    let mut out = String::new();
    write!(
        out,
        "{}",
        now.unwrap_or_else(chrono::Utc::now).format(format)
    )
    .map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        )
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: serde_json::Value) -> String {
        let env = environment(src, None, 1_000_000).unwrap();
        env.get_template("chat").unwrap().render(ctx).unwrap()
    }

    #[test]
    fn blocks_trim_and_strip_as_transformers_sets_them() {
        let src = "<a>\n  {% if true %}\n    x\n  {% endif %}\n<b>\n";
        assert_eq!(render(src, serde_json::json!({})), "<a>\n    x\n<b>");
    }

    #[test]
    fn a_backslash_newline_in_a_string_literal_continues_it() {
        let src = "{{ \"one \\\ntwo\" }}|{{ 'a\\'b' }}|keep \\\n outside";
        assert_eq!(
            render(src, serde_json::json!({})),
            "one two|a'b|keep \\\n outside"
        );
    }

    #[test]
    fn the_generation_tag_renders_its_body() {
        let src = "<s>\n{%- generation -%}\n  hi\n{%- endgeneration %}\n</s>";
        assert_eq!(render(src, serde_json::json!({})), "<s>hi</s>");
    }

    #[test]
    fn values_print_as_python_does() {
        let src =
            "{{ none }} {{ t }} {{ l }} {{ m }} {{ f }} {{ m|string }} {{ none is iterable }}";
        let ctx = serde_json::json!({"t": true, "l": ["a", 1, null], "m": {"k": "it's"}, "f": 2.0});
        assert_eq!(
            render(src, ctx),
            "None True ['a', 1, None] {'k': \"it's\"} 2.0 {'k': \"it's\"} False"
        );
    }

    #[test]
    fn tojson_is_json_dumps() {
        let ctx = serde_json::json!({"v": {"b": [1, "é\n"], "a": null}});
        assert_eq!(
            render("{{ v|tojson }}", ctx.clone()),
            r#"{"b": [1, "é\n"], "a": null}"#
        );
        assert_eq!(
            render("{{ v|tojson(indent=2, sort_keys=true) }}", ctx),
            "{\n  \"a\": null,\n  \"b\": [\n    1,\n    \"é\\n\"\n  ]\n}"
        );
    }

    #[test]
    fn raise_exception_is_an_error_with_its_message() {
        let env = environment(
            "{{ raise_exception('roles must alternate') }}",
            None,
            1_000_000,
        )
        .unwrap();
        let e = env.get_template("chat").unwrap().render(()).unwrap_err();
        assert!(e.to_string().contains("roles must alternate"), "{e}");
    }
}
