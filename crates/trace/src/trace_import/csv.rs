//! llama.cpp-style MoE trace CSV: one routed expert per row, `layer,expert`,
//! or `token,layer,expert[,weight]`, with or without a header line naming
//! the columns. Consecutive rows of one layer form a token's k ids there; a
//! new token starts when the token column changes or, without one, when the
//! layer index does not go up.

use super::collect::{Collector, Route};
use super::spellings::{LAYER, TOKEN, WEIGHTS};
use super::types::{ImportError, Loc};

/// Header names of the expert column.
const EXPERT: [&str; 6] = [
    "expert",
    "expert_id",
    "expert_idx",
    "experts",
    "expert_ids",
    "topk_ids",
];

/// Which field holds what.
#[derive(Debug, Clone, Copy)]
struct Columns {
    token: Option<usize>,
    layer: usize,
    expert: usize,
    weight: Option<usize>,
    count: usize,
}

impl Columns {
    /// Columns by position in a file without a header.
    fn positional(count: usize, at: Loc) -> Result<Self, ImportError> {
        let (token, layer, expert, weight) = match count {
            2 => (None, 0, 1, None),
            3 => (Some(0), 1, 2, None),
            4 => (Some(0), 1, 2, Some(3)),
            n => {
                return Err(ImportError::at(
                    at,
                    format!("{n} columns: expected layer,expert or token,layer,expert[,weight] (or a header line)"),
                ))
            }
        };
        Ok(Self {
            token,
            layer,
            expert,
            weight,
            count,
        })
    }

    /// Columns named by a header line.
    fn named(names: &[&str], at: Loc) -> Result<Self, ImportError> {
        let find = |list: &[&str]| {
            names
                .iter()
                .position(|n| list.iter().any(|l| l.eq_ignore_ascii_case(n)))
        };
        let weight_names: Vec<&str> = WEIGHTS.iter().copied().chain(["weight"]).collect();
        let need = |col: Option<usize>, what: &str, list: &[&str]| {
            col.ok_or_else(|| {
                ImportError::at(
                    at,
                    format!("the header names no {what} column (one of {list:?})"),
                )
            })
        };
        Ok(Self {
            token: find(&TOKEN),
            layer: need(find(&LAYER), "layer", &LAYER)?,
            expert: need(find(&EXPERT), "expert", &EXPERT)?,
            weight: find(&weight_names),
            count: names.len(),
        })
    }

    fn describe(&self, names: &[&str], header: bool) -> String {
        let mut cols = Vec::new();
        if let Some(t) = self.token {
            cols.push(names.get(t).copied().unwrap_or("token"));
        }
        cols.push(names.get(self.layer).copied().unwrap_or("layer"));
        cols.push(names.get(self.expert).copied().unwrap_or("expert"));
        if let Some(w) = self.weight {
            cols.push(names.get(w).copied().unwrap_or("weight"));
        }
        let how = if header { "header" } else { "no header" };
        format!("columns {} ({how})", cols.join(","))
    }
}

/// The route being gathered: its token, layer, ids so far, first line.
struct Group {
    token: Option<String>,
    route: Route,
    at: Loc,
}

/// Read every row into `c`; returns the columns found.
pub(super) fn parse(input: &[u8], c: &mut Collector) -> Result<String, ImportError> {
    let text = std::str::from_utf8(input)
        .map_err(|e| ImportError::at(Loc::Byte(e.valid_up_to() as u64), "not UTF-8 text"))?;
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (Loc::Line(i as u64 + 1), l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    let Some((at, first)) = lines.next() else {
        return Err(ImportError::at(Loc::Input, "empty: no rows to import"));
    };
    let names: Vec<&str> = first.split(',').map(str::trim).collect();
    let header = names.iter().any(|n| n.parse::<f64>().is_err());
    let cols = match header {
        true => Columns::named(&names, at)?,
        false => Columns::positional(names.len(), at)?,
    };
    let rows = std::iter::once((at, first))
        .filter(|_| !header)
        .chain(lines);
    let mut group: Option<Group> = None;
    for (at, line) in rows {
        group = Some(row(line, at, cols, group, c)?);
    }
    if let Some(g) = group {
        c.push(g.route, g.at)?;
    }
    let shown: &[&str] = if header { &names } else { &[] };
    Ok(cols.describe(shown, header))
}

/// One row: added to the group, or closing it and starting the next.
fn row(
    line: &str,
    at: Loc,
    cols: Columns,
    group: Option<Group>,
    c: &mut Collector,
) -> Result<Group, ImportError> {
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    if fields.len() != cols.count {
        return Err(ImportError::at(
            at,
            format!("{} fields, expected {}", fields.len(), cols.count),
        ));
    }
    let layer = number::<u32>(fields[cols.layer], "layer", INTEGER, at)?;
    let expert = number::<u32>(fields[cols.expert], "expert", INTEGER, at)?;
    let weight = cols
        .weight
        .map(|w| number::<f32>(fields[w], "weight", "a number", at))
        .transpose()?;
    if weight.is_some_and(|w| !w.is_finite()) {
        return Err(ImportError::at(at, "a router weight that is not finite"));
    }
    let token = cols.token.map(|t| fields[t].to_string());
    if let Some(mut g) = group {
        let same_token = match &token {
            Some(_) => token == g.token,
            None => layer >= g.route.layer,
        };
        if same_token && layer == g.route.layer {
            g.route.ids.push(expert);
            if let (Some(ws), Some(w)) = (g.route.weights.as_mut(), weight) {
                ws.push(w);
            }
            return Ok(g);
        }
        c.push(g.route, g.at)?;
        if !same_token {
            c.start_token();
        }
    }
    Ok(Group {
        token,
        route: Route {
            layer,
            ids: vec![expert],
            weights: weight.map(|w| vec![w]),
        },
        at,
    })
}

const INTEGER: &str = "a non-negative integer";

/// A field that must parse as a number.
fn number<T: std::str::FromStr>(
    field: &str,
    what: &str,
    kind: &str,
    at: Loc,
) -> Result<T, ImportError> {
    field
        .parse()
        .map_err(|_| ImportError::at(at, format!("{what} `{field}` is not {kind}")))
}
