//! JSONL routing logs: one object per line, either one route per line
//! (`{"token_idx": 0, "layer": 3, "experts": [5, 1], "weights": [...]}`) or
//! one token per line with a list per layer (`{"experts": [[5, 1], [2, 7]]}`).
//!
//! The first record's field names are the file's spelling; every record must
//! use them. Without a token field, a new token starts when the layer does
//! not go up (one route per line) or at every line (a token per line).

use serde_json::{Map, Value};

use super::collect::{Collector, Route};
use super::json::{json_array, json_route, pick};
use super::spellings::{IDS, LAYER, TOKEN, WEIGHTS};
use super::types::{ImportError, Loc};

/// The field names of a file.
#[derive(Clone, Copy)]
struct Spelling {
    ids: &'static str,
    weights: Option<&'static str>,
    token: Option<&'static str>,
    /// None: one token per line, ids nested per layer.
    layer: Option<&'static str>,
}

impl Spelling {
    /// The spelling of the first record.
    fn of(obj: &Map<String, Value>, at: Loc) -> Result<Self, ImportError> {
        let ids = pick(obj, &IDS).ok_or_else(|| {
            ImportError::at(
                at,
                format!("no expert ids: expected a field named one of {IDS:?}"),
            )
        })?;
        let nested = obj[ids]
            .as_array()
            .and_then(|a| a.first())
            .is_some_and(Value::is_array);
        let layer = pick(obj, &LAYER);
        if layer.is_none() && !nested {
            return Err(ImportError::at(
                at,
                format!(
                    "`{ids}` is one layer's ids but the record names no layer (one of {LAYER:?})"
                ),
            ));
        }
        Ok(Self {
            ids,
            weights: pick(obj, &WEIGHTS),
            token: pick(obj, &TOKEN),
            layer: layer.filter(|_| !nested),
        })
    }

    fn describe(&self) -> String {
        let mut s = format!("ids `{}`", self.ids);
        match self.layer {
            Some(l) => s += &format!(", layer `{l}`"),
            None => s += ", a list per layer",
        }
        match self.token {
            Some(t) => s += &format!(", token `{t}`"),
            None => s += ", tokens in line order",
        }
        if let Some(w) = self.weights {
            s += &format!(", weights `{w}`");
        }
        s
    }
}

/// Read every line into `c`; returns the spelling found.
pub(super) fn parse(input: &[u8], c: &mut Collector) -> Result<String, ImportError> {
    let mut spelling: Option<Spelling> = None;
    let mut last_token: Option<Value> = None;
    let mut last_layer: Option<u32> = None;
    for (i, line) in input.split(|&b| b == b'\n').enumerate() {
        let at = Loc::Line(i as u64 + 1);
        if line.trim_ascii().is_empty() {
            continue;
        }
        let obj = object(line, at)?;
        let sp = match spelling {
            Some(s) => s,
            None => {
                let s = Spelling::of(&obj, at)?;
                spelling = Some(s);
                s
            }
        };
        let token = field(&obj, sp.token, at)?;
        let routes = routes(&obj, &sp, at)?;
        let new_token = match (&token, sp.layer) {
            (Some(t), _) => last_token.as_ref() != Some(t),
            (None, None) => true,
            (None, Some(_)) => last_layer.is_none_or(|l| routes[0].layer <= l),
        };
        if new_token {
            c.start_token();
        }
        last_token = token.cloned();
        last_layer = routes.last().map(|r| r.layer);
        for r in routes {
            c.push(r, at)?;
        }
    }
    Ok(spelling.map_or_else(String::new, |s| s.describe()))
}

/// One line as a JSON object.
fn object(line: &[u8], at: Loc) -> Result<Map<String, Value>, ImportError> {
    match serde_json::from_slice::<Value>(line) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(v) => Err(ImportError::at(
            at,
            format!("expected a JSON object, found {}", kind(&v)),
        )),
        Err(e) if e.is_eof() => Err(ImportError::at(
            at,
            format!("the JSON object is cut off ({e}): a truncated file?"),
        )),
        Err(e) => Err(ImportError::at(at, format!("malformed JSON: {e}"))),
    }
}

/// What kind of JSON value a record is, as an error names it ("an array").
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The field `name` of the file's spelling, which every record must have.
fn field<'a>(
    obj: &'a Map<String, Value>,
    name: Option<&'static str>,
    at: Loc,
) -> Result<Option<&'a Value>, ImportError> {
    match name {
        None => Ok(None),
        Some(n) => obj.get(n).map(Some).ok_or_else(|| {
            ImportError::at(
                at,
                format!("no `{n}` field (the file's first record has one)"),
            )
        }),
    }
}

/// The routes of one record: one, or one per layer.
fn routes(obj: &Map<String, Value>, sp: &Spelling, at: Loc) -> Result<Vec<Route>, ImportError> {
    let ids = field(obj, Some(sp.ids), at)?.expect("named");
    let weights = field(obj, sp.weights, at)?;
    match sp.layer {
        Some(name) => {
            let layer = field(obj, Some(name), at)?.expect("named");
            let layer = layer
                .as_u64()
                .and_then(|l| u32::try_from(l).ok())
                .ok_or_else(|| {
                    ImportError::at(at, format!("layer {layer} is not a non-negative integer"))
                })?;
            Ok(vec![json_route(layer, ids, weights, at)?])
        }
        None => {
            let per_layer = json_array(ids, sp.ids, at)?;
            if per_layer.is_empty() {
                return Err(ImportError::at(at, format!("`{}` lists no layers", sp.ids)));
            }
            let w = weights.map(|w| json_array(w, "weights", at)).transpose()?;
            if let Some(w) = &w {
                if w.len() != per_layer.len() {
                    return Err(ImportError::at(
                        at,
                        format!(
                            "{} layers of weights for {} of ids",
                            w.len(),
                            per_layer.len()
                        ),
                    ));
                }
            }
            per_layer
                .iter()
                .enumerate()
                .map(|(l, ids)| json_route(l as u32, ids, w.map(|w| &w[l]), at))
                .collect()
        }
    }
}
