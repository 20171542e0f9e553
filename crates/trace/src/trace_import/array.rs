//! Routed-experts arrays as JSON (vLLM, SGLang): `[tokens][layers][k]` expert
//! ids, bare or as a field of an object (`routed_experts` or one of the ids
//! spellings), with router weights of the same shape beside them when the
//! object has a weights field.

use serde_json::Value;

use super::collect::Collector;
use super::json::{json_array, json_route};
use super::spellings::{IDS, WEIGHTS};
use super::types::{ImportError, Loc};

/// Field names of the ids array, tried in order.
const ARRAY_IDS: [&str; 5] = ["routed_experts", IDS[0], IDS[1], IDS[2], IDS[3]];

/// Field names of the weights array, tried in order.
const ARRAY_WEIGHTS: [&str; 6] = [
    "routed_weights",
    WEIGHTS[0],
    WEIGHTS[1],
    WEIGHTS[2],
    WEIGHTS[3],
    WEIGHTS[4],
];

/// The field of `v` holding a nested ids array three deep, when `v` is an
/// object with one (`None` for a bare array).
pub(super) fn nested_ids(v: &Value) -> Option<&'static str> {
    let obj = v.as_object()?;
    ARRAY_IDS
        .into_iter()
        .find(|k| obj.get(*k).is_some_and(|a| depth(a) >= 3))
}

/// How deep the first elements nest.
fn depth(v: &Value) -> usize {
    match v.as_array().and_then(|a| a.first()) {
        Some(first) => 1 + depth(first),
        None => usize::from(v.is_array()),
    }
}

/// Read the whole array into `c`; returns what was read.
pub(super) fn parse(input: &[u8], c: &mut Collector) -> Result<String, ImportError> {
    let v: Value = serde_json::from_slice(input).map_err(|e| {
        let what = match e.is_eof() {
            true => format!("the JSON ends early ({e}): a truncated file?"),
            false => format!("malformed JSON: {e}"),
        };
        ImportError::at(Loc::Line(e.line() as u64), what)
    })?;
    let (ids, weights, spelling) = match &v {
        Value::Array(_) => (&v, None, "a bare [tokens][layers][k] array".to_string()),
        Value::Object(obj) => {
            let key = nested_ids(&v).ok_or_else(|| {
                ImportError::at(
                    Loc::Input,
                    format!("no [tokens][layers][k] array under any of {ARRAY_IDS:?}"),
                )
            })?;
            let wkey = ARRAY_WEIGHTS.into_iter().find(|k| obj.contains_key(*k));
            let mut s = format!("ids `{key}`");
            if let Some(w) = wkey {
                s += &format!(", weights `{w}`");
            }
            (&obj[key], wkey.map(|k| &obj[k]), s)
        }
        other => {
            return Err(ImportError::at(
                Loc::Input,
                format!("expected an array or an object, found {other}"),
            ))
        }
    };
    read_tokens(ids, weights, c)?;
    Ok(spelling)
}

/// Every token's layers.
fn read_tokens(ids: &Value, weights: Option<&Value>, c: &mut Collector) -> Result<(), ImportError> {
    let tokens = json_array(ids, "the ids", Loc::Input)?;
    let wtokens = weights
        .map(|w| json_array(w, "the weights", Loc::Input))
        .transpose()?;
    if let Some(w) = wtokens {
        if w.len() != tokens.len() {
            return Err(ImportError::at(
                Loc::Input,
                format!("{} tokens of weights for {} of ids", w.len(), tokens.len()),
            ));
        }
    }
    for (t, layers) in tokens.iter().enumerate() {
        let t = t as u64;
        let token_at = Loc::Entry { token: t, layer: 0 };
        let layers = json_array(layers, "a token", token_at)?;
        let wlayers = wtokens
            .map(|w| json_array(&w[t as usize], "a token's weights", token_at))
            .transpose()?;
        c.start_token();
        for (l, ids) in layers.iter().enumerate() {
            let at = Loc::Entry {
                token: t,
                layer: l as u32,
            };
            let w = wlayers
                .map(|w| w.get(l).ok_or_else(|| missing(at)))
                .transpose()?;
            c.push(json_route(l as u32, ids, w, at)?, at)?;
        }
    }
    Ok(())
}

fn missing(at: Loc) -> ImportError {
    ImportError::at(at, "no router weights for this layer")
}
