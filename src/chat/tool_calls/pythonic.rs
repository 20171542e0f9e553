//! LFM2's Python-style calls: `[get_weather(city='Paris', days=3), f()]`,
//! keyword arguments only, values Python literals (strings in either quote,
//! numbers, `True`/`False`/`None`, lists, dicts) or JSON.

use serde_json::{Map, Number, Value};

use super::call::ToolCall;
use super::gbnf::Apart;
use super::partial::{Args, Open};
use super::syntax::{Frame, Syntax};
use crate::llama::grammar::GrammarError;

/// `<|tool_call_start|>[f(a='x')]<|tool_call_end|>`.
pub(crate) struct Pythonic;

impl Syntax for Pythonic {
    fn name(&self) -> &'static str {
        "pythonic"
    }

    fn frame(&self) -> Option<Frame> {
        Some(Frame {
            open: "<|tool_call_start|>",
            close: Some("<|tool_call_end|>"),
        })
    }

    fn special_text(&self, tools_offered: bool) -> bool {
        tools_offered
    }

    fn calls(&self, block: &str, _tools: Option<&Value>) -> Option<Vec<ToolCall>> {
        calls(block)
    }

    fn open_calls(&self, block: &str, _tools: Option<&Value>) -> Vec<Open> {
        open_calls(block)
    }

    fn forced_block(&self) -> (&'static str, &'static str) {
        ("<|tool_call_start|>[", "]<|tool_call_end|>")
    }

    /// Every argument as a Python keyword whose value is JSON.
    fn call_rule(
        &self,
        prefix: &str,
        name: &str,
        params: &Value,
        rules: &mut Vec<String>,
    ) -> Result<String, GrammarError> {
        let apart = Apart {
            head: format!("{name}("),
            tail: ")",
            sep: Some(", "),
            strings_as_text: false,
        };
        apart.rule(prefix, params, rules, |key, _| (format!("{key}="), ""))
    }
}

/// The calls of a `[...]` list (the brackets may be left out).
fn calls(block: &str) -> Option<Vec<ToolCall>> {
    let mut p = Reader {
        s: block.trim(),
        at: 0,
    };
    let bracketed = p.eat('[');
    let mut calls = Vec::new();
    loop {
        p.skip_ws();
        if p.done() || (bracketed && p.peek() == Some(']')) {
            break;
        }
        calls.push(p.call()?);
        p.skip_ws();
        if !p.eat(',') {
            break;
        }
    }
    if bracketed && !p.eat(']') {
        return None;
    }
    p.skip_ws();
    p.done().then_some(calls)
}

/// The calls of a list so far: the whole ones, then one whose name and `(`
/// came (its arguments go out whole, with the block).
fn open_calls(block: &str) -> Vec<Open> {
    let mut p = Reader {
        s: block.trim_start(),
        at: 0,
    };
    p.eat('[');
    let mut out = Vec::new();
    loop {
        let at = p.at;
        match p.call() {
            Some(c) if !p.done() => out.push(Open::whole(&c)),
            _ => {
                p.at = at;
                if let Some(name) = p.ident().map(str::to_string) {
                    if p.eat('(') {
                        out.push(Open::new(&name, Args::default()));
                    }
                }
                return out;
            }
        }
        if !p.eat(',') {
            return out;
        }
    }
}

/// A cursor over the text.
struct Reader<'a> {
    s: &'a str,
    at: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<char> {
        self.s[self.at..].chars().next()
    }

    fn done(&self) -> bool {
        self.at >= self.s.len()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += c.len_utf8();
        Some(c)
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        let hit = self.peek() == Some(c);
        if hit {
            self.at += c.len_utf8();
        }
        hit
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.at += 1;
        }
    }

    /// A name: letters, digits, `_`, `.`, `-`.
    fn ident(&mut self) -> Option<&str> {
        self.skip_ws();
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '-'))
        {
            self.bump();
        }
        (self.at > start).then(|| &self.s[start..self.at])
    }

    /// `NAME(k=v, ...)`.
    fn call(&mut self) -> Option<ToolCall> {
        let name = self.ident()?.to_string();
        if !self.eat('(') {
            return None;
        }
        let mut args = Map::new();
        while !self.eat(')') {
            let key = self.ident()?.to_string();
            if !self.eat('=') {
                return None;
            }
            args.insert(key, self.value()?);
            if !self.eat(',') && self.peek() != Some(')') {
                return None;
            }
        }
        Some(ToolCall::new(&name, Value::Object(args).to_string()))
    }

    /// A Python literal or JSON value.
    fn value(&mut self) -> Option<Value> {
        self.skip_ws();
        match self.peek()? {
            q @ ('\'' | '"') => self.string(q).map(Value::String),
            '[' => self.list(),
            '{' => self.dict(),
            _ => self.word(),
        }
    }

    /// A quoted string, backslash escapes read the Python way.
    fn string(&mut self, quote: char) -> Option<String> {
        self.bump();
        let mut out = String::new();
        loop {
            match self.bump()? {
                c if c == quote => return Some(out),
                '\\' => out.push(match self.bump()? {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    c => c,
                }),
                c => out.push(c),
            }
        }
    }

    fn list(&mut self) -> Option<Value> {
        self.bump();
        let mut items = Vec::new();
        while !self.eat(']') {
            items.push(self.value()?);
            if !self.eat(',') && self.peek() != Some(']') {
                return None;
            }
        }
        Some(Value::Array(items))
    }

    fn dict(&mut self) -> Option<Value> {
        self.bump();
        let mut map = Map::new();
        while !self.eat('}') {
            self.skip_ws();
            let key = match self.peek()? {
                q @ ('\'' | '"') => self.string(q)?,
                _ => return None,
            };
            if !self.eat(':') {
                return None;
            }
            map.insert(key, self.value()?);
            if !self.eat(',') && self.peek() != Some('}') {
                return None;
            }
        }
        Some(Value::Object(map))
    }

    /// A number or `True`/`False`/`None` (or JSON's `true`/`false`/`null`).
    fn word(&mut self) -> Option<Value> {
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_alphanumeric() || matches!(c, '.' | '-' | '+' | '_'))
        {
            self.bump();
        }
        match &self.s[start..self.at] {
            "True" | "true" => Some(Value::Bool(true)),
            "False" | "false" => Some(Value::Bool(false)),
            "None" | "null" => Some(Value::Null),
            w => w
                .parse::<i64>()
                .ok()
                .map(Value::from)
                .or_else(|| Number::from_f64(w.parse().ok()?).map(Value::Number)),
        }
    }
}
