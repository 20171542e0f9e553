//! JSON values read as a route's parts (ids, weights, the field a name
//! goes by), shared by the JSON formats.

use super::collect::Route;
use super::types::{ImportError, Loc};

/// The first of `names` that `obj` has.
pub(crate) fn pick(
    obj: &serde_json::Map<String, serde_json::Value>,
    names: &[&'static str],
) -> Option<&'static str> {
    names.iter().copied().find(|n| obj.contains_key(*n))
}

/// A JSON value as an expert id.
pub(crate) fn json_id(v: &serde_json::Value, at: Loc) -> Result<u32, ImportError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| ImportError::at(at, format!("expert id {v} is not a non-negative integer")))
}

/// A JSON value that must be an array (`what` names it in the error).
pub(crate) fn json_array<'a>(
    v: &'a serde_json::Value,
    what: &str,
    at: Loc,
) -> Result<&'a Vec<serde_json::Value>, ImportError> {
    v.as_array()
        .ok_or_else(|| ImportError::at(at, format!("{what} is {v}, not an array")))
}

/// One layer's route from its JSON ids and (optional) weights.
pub(crate) fn json_route(
    layer: u32,
    ids: &serde_json::Value,
    weights: Option<&serde_json::Value>,
    at: Loc,
) -> Result<Route, ImportError> {
    let ids = json_array(ids, "the expert ids", at)?
        .iter()
        .map(|v| json_id(v, at))
        .collect::<Result<Vec<_>, _>>()?;
    let weights = weights
        .map(|w| {
            json_array(w, "the router weights", at)?
                .iter()
                .map(|v| json_weight(v, at))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    Ok(Route {
        layer,
        ids,
        weights,
    })
}

/// A JSON value as a router weight.
pub(crate) fn json_weight(v: &serde_json::Value, at: Loc) -> Result<f32, ImportError> {
    v.as_f64()
        .map(|w| w as f32)
        .filter(|w| w.is_finite())
        .ok_or_else(|| ImportError::at(at, format!("router weight {v} is not a finite number")))
}
