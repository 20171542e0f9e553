//! The regular expressions a `pattern` may hold: the subset llama.cpp's
//! converter translates into grammar that writes valid JSON. Anything else
//! it would drop (any string accepted: unanchored patterns, `\d`, lookaround,
//! backreferences) or translate into text that breaks the JSON string (`.`,
//! `[^...]` and classes that hold `"`, `\` or control characters) is refused.
//!
//! Accepted: `^` ... `$` around literals (escapes `\^ \$ \. \| \? \* \+ \(
//! \) \[ \] \{ \}`), classes `[a-z_]` (escapes `\- \[ \]`), groups `( )` and
//! `(?: )`, `|`, and one quantifier `* + ? {m} {m,} {m,n}` per atom, with
//! `m <= n <= MAX_REPEAT` and nested repetition within llama.cpp's bound.

use serde_json::{Map, Value};

use super::refusal::{RefusalKind, MAX_PATTERN_BYTES, MAX_REPEAT};

type Refusal = (RefusalKind, String);

/// Whether `o`'s `format` is one the converter writes (it then drops lengths).
pub(super) fn known_format(o: &Map<String, Value>) -> bool {
    let Some(f) = o.get("format").and_then(Value::as_str) else {
        return false;
    };
    let uuid = f.len() == 5
        && f.starts_with("uuid")
        && ('1'..='5').contains(&f.chars().nth(4).unwrap_or('0'));
    matches!(f, "date" | "time" | "date-time" | "uuid") || uuid
}

/// Whether `pattern` is in the subset above.
pub(super) fn check(pattern: &str) -> Result<(), Refusal> {
    let unsupported = |why: String| Err((RefusalKind::Unsupported, why));
    if pattern.len() > MAX_PATTERN_BYTES {
        let why = format!("{} bytes, above {MAX_PATTERN_BYTES}", pattern.len());
        return Err((RefusalKind::TooLarge, why));
    }
    let Some(inner) = pattern.strip_prefix('^').and_then(|p| p.strip_suffix('$')) else {
        return unsupported(
            "the grammar follows only a pattern anchored at both ends (^...$)".into(),
        );
    };
    if inner.ends_with('\\') && !inner.ends_with("\\\\") {
        return unsupported("the pattern ends in an escaped $".into());
    }
    let mut p = Parser {
        chars: inner.chars().collect(),
        at: 0,
    };
    p.alternation(0)?;
    match p.peek() {
        None => Ok(()),
        Some(c) => unsupported(format!("unexpected {c:?} at {}", p.at)),
    }
}

/// A recursive-descent reading of the subset; each part returns how many
/// grammar rules it makes (llama.cpp bounds rules times repetitions).
struct Parser {
    chars: Vec<char>,
    at: usize,
}

/// A character JSON takes raw inside a string (the grammar does not escape).
fn json_safe(c: char) -> bool {
    c != '"' && c != '\\' && c >= ' '
}

const ESCAPABLE: &str = "^$.|?*+()[]{}";

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn bad<T>(&self, why: &str) -> Result<T, Refusal> {
        Err((
            RefusalKind::Unsupported,
            format!("{why} (at character {})", self.at),
        ))
    }

    fn alternation(&mut self, depth: usize) -> Result<u64, Refusal> {
        if depth > 32 {
            return self.bad("groups nest too deep");
        }
        let mut rules = self.sequence(depth)?;
        while self.peek() == Some('|') {
            self.at += 1;
            rules += self.sequence(depth)?;
        }
        Ok(rules)
    }

    fn sequence(&mut self, depth: usize) -> Result<u64, Refusal> {
        let mut rules = 0;
        let mut empty = true;
        while let Some(c) = self.peek().filter(|&c| c != '|' && c != ')') {
            let atom = match c {
                '(' => self.group(depth)?,
                '[' => self.class()?,
                _ => self.literal()?,
            };
            let repeated = matches!(self.peek(), Some('*' | '+' | '?' | '{'));
            if !c.is_ascii() && repeated {
                // The converter reads the pattern byte by byte: it would
                // repeat the character's last byte alone.
                return self.bad(
                    "a quantifier right after a non-ASCII character: put the character in a group",
                );
            }
            rules += self.quantifier(atom)?;
            empty = false;
        }
        if empty {
            return self.bad("an empty alternative");
        }
        Ok(rules)
    }

    fn group(&mut self, depth: usize) -> Result<u64, Refusal> {
        self.at += 1;
        if self.peek() == Some('?') {
            if self.chars.get(self.at + 1) != Some(&':') {
                return self.bad("lookaround, named groups and flags have no grammar");
            }
            self.at += 2;
        }
        let rules = self.alternation(depth + 1)?;
        if self.peek() != Some(')') {
            return self.bad("an unclosed group");
        }
        self.at += 1;
        Ok(rules + 1)
    }

    fn class(&mut self) -> Result<u64, Refusal> {
        self.at += 1;
        if self.peek() == Some('^') {
            return self.bad("a negated class would admit \" and \\, which break the JSON string");
        }
        let mut items = Vec::new();
        loop {
            let c = match self.peek() {
                None => return self.bad("an unclosed class"),
                Some(']') => break,
                Some('\\') => {
                    let e = self.chars.get(self.at + 1).copied().unwrap_or('\\');
                    if !"-[]".contains(e) {
                        return self
                            .bad("in a class only \\- \\[ \\] are escapes the grammar takes");
                    }
                    self.at += 2;
                    e
                }
                Some(c) => {
                    self.at += 1;
                    c
                }
            };
            items.push(c);
        }
        self.at += 1;
        self.class_items(&items)
    }

    /// A class's characters and ranges (`a-z`; `-` first or last is itself).
    fn class_items(&self, items: &[char]) -> Result<u64, Refusal> {
        if items.is_empty() {
            return self.bad("an empty class");
        }
        let mut i = 0;
        while i < items.len() {
            let (lo, hi) = if i + 2 < items.len() && items[i + 1] == '-' {
                i += 3;
                (items[i - 3], items[i - 1])
            } else {
                i += 1;
                (items[i - 1], items[i - 1])
            };
            if lo > hi {
                return self.bad("a range whose ends are crossed");
            }
            let breaks = |c: char| !json_safe(c);
            if breaks(lo) || breaks(hi) || (lo..=hi).contains(&'"') || (lo..=hi).contains(&'\\') {
                return self.bad("the class admits \", \\ or a control character, which the grammar would write unescaped");
            }
        }
        Ok(0)
    }

    fn literal(&mut self) -> Result<u64, Refusal> {
        let c = self.chars[self.at];
        match c {
            '\\' => {
                let e = self.chars.get(self.at + 1).copied();
                if !e.is_some_and(|e| ESCAPABLE.contains(e)) {
                    return self.bad("only \\ before one of ^$.|?*+()[]{} is an escape the grammar takes (no \\d \\w \\s, backreferences or code escapes: write a class like [0-9])");
                }
                self.at += 2;
            }
            '.' => {
                return self
                    .bad("'.' would admit \" and \\, which break the JSON string: write a class")
            }
            '^' | '$' => return self.bad("an anchor inside the pattern"),
            '*' | '+' | '?' | '{' | '}' | ']' => {
                return self.bad("a quantifier or bracket with nothing before it")
            }
            c if !json_safe(c) => {
                return self
                    .bad("a \" or control character, which the grammar would write unescaped")
            }
            _ => self.at += 1,
        }
        Ok(0)
    }

    /// The quantifier after an atom of `rules` rules, if any: the rules
    /// then made, within llama.cpp's bound on rules times repetitions.
    fn quantifier(&mut self, rules: u64) -> Result<u64, Refusal> {
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => return self.counted(rules),
            _ => return Ok(rules),
        };
        self.at += 1;
        self.after_quantifier(rules, min, max)
    }

    fn counted(&mut self, rules: u64) -> Result<u64, Refusal> {
        let close = self.chars[self.at..].iter().position(|&c| c == '}');
        let Some(close) = close.map(|c| self.at + c) else {
            return self.bad("an unclosed {");
        };
        let body: String = self.chars[self.at + 1..close].iter().collect();
        let num = |s: &str| {
            s.parse::<u64>()
                .ok()
                .filter(|_| s.chars().all(|c| c.is_ascii_digit()))
        };
        let (min, max) = match body.split_once(',') {
            None => (num(&body), num(&body)),
            Some((a, "")) => (num(a), None),
            Some((a, b)) => (num(a), Some(num(b).unwrap_or(u64::MAX))),
        };
        let Some(min) = min else {
            return self.bad("a {m,n} quantifier the grammar cannot read");
        };
        if max == Some(u64::MAX) || max.is_some_and(|m| m < min) {
            return self.bad("a {m,n} quantifier with n below m (no string matches it)");
        }
        self.at = close + 1;
        self.after_quantifier(rules, min, max)
    }

    fn after_quantifier(&mut self, rules: u64, min: u64, max: Option<u64>) -> Result<u64, Refusal> {
        if matches!(self.peek(), Some('*' | '+' | '?' | '{')) {
            return self.bad("a quantifier after a quantifier");
        }
        let times = max.unwrap_or(min).max(1);
        if min > MAX_REPEAT
            || max.is_some_and(|m| m > MAX_REPEAT)
            || rules.max(1) * times > MAX_REPEAT
        {
            let why = format!("repetition beyond {MAX_REPEAT}, the most llama.cpp's grammar holds (nested repetitions multiply)");
            return Err((RefusalKind::TooLarge, why));
        }
        Ok(rules + times)
    }
}
