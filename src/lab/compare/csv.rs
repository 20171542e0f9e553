//! Reading a run's telemetry CSV: the `# bmoe_metrics` line, the `# key=value`
//! preamble, the column header, the number rows and the `# summary` trailer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::CompareError;

/// One run's CSV.
#[derive(Debug, Clone)]
pub struct RunCsv {
    pub(crate) path: PathBuf,
    pub preamble: BTreeMap<String, String>,
    pub trailer: BTreeMap<String, String>,
    pub(crate) columns: Vec<String>,
    pub rows: Vec<Vec<f64>>,
}

impl RunCsv {
    /// Read and parse a run's CSV; anything but a regular file (which could
    /// block, like a FIFO, or never end, like /dev/zero) is refused unread.
    pub fn open(path: &Path) -> Result<Self, CompareError> {
        let read_err = |source| CompareError::Read {
            path: path.to_path_buf(),
            source,
        };
        if !std::fs::metadata(path).map_err(read_err)?.is_file() {
            return Err(CompareError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        Self::parse(path, &text)
    }

    /// Parse a run's CSV text (`path` names it in errors).
    pub(crate) fn parse(path: &Path, text: &str) -> Result<Self, CompareError> {
        let err = |line: usize, msg: String| CompareError::Format {
            path: path.to_path_buf(),
            line,
            msg,
        };
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, "# bmoe_metrics")) => {}
            _ => return Err(err(1, "first line is not `# bmoe_metrics`".into())),
        }
        let mut run = RunCsv {
            path: path.to_path_buf(),
            preamble: BTreeMap::new(),
            trailer: BTreeMap::new(),
            columns: Vec::new(),
            rows: Vec::new(),
        };
        let mut in_trailer = false;
        for (i, line) in lines {
            let n = i + 1;
            if line.is_empty() {
                continue;
            }
            if line == "# summary" {
                in_trailer = true;
                continue;
            }
            if let Some(kv) = line.strip_prefix("# ") {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| err(n, format!("`{line}` is not `# key=value`")))?;
                let map = if in_trailer {
                    &mut run.trailer
                } else {
                    &mut run.preamble
                };
                map.insert(k.to_owned(), v.to_owned());
                continue;
            }
            if in_trailer {
                return Err(err(n, "a row after the `# summary` trailer".into()));
            }
            if run.columns.is_empty() {
                run.columns = line.split(',').map(str::to_owned).collect();
                for need in ["wall_ms", "prefill"] {
                    if !run.columns.iter().any(|c| c == need) {
                        return Err(err(n, format!("no `{need}` column")));
                    }
                }
                continue;
            }
            let row = parse_row(line, run.columns.len()).map_err(|msg| err(n, msg))?;
            run.rows.push(row);
        }
        if run.columns.is_empty() {
            return Err(err(1, "no column header".into()));
        }
        Ok(run)
    }

    fn col(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }

    /// Values of `name` over the single-token decode rows (0 where the column is absent).
    pub fn decode_series(&self, name: &str) -> Vec<f64> {
        let prefill = self.col("prefill");
        let c = self.col(name);
        self.rows
            .iter()
            .filter(|r| prefill.is_none_or(|p| r[p] == 0.0))
            .map(|r| c.map_or(0.0, |c| r[c]))
            .collect()
    }

    /// `off` for a plain run, the speculation source otherwise.
    pub(crate) fn spec(&self) -> &str {
        self.preamble.get("spec").map_or("off", String::as_str)
    }

    pub fn aborted(&self) -> bool {
        self.trailer.get("aborted").is_some_and(|v| v == "1")
            || (self.trailer.is_empty() && !self.rows.is_empty())
    }

    pub(crate) fn lossy(&self) -> bool {
        self.preamble.get("lossy").is_some_and(|v| v == "1")
    }
}

/// One number row of `columns` fields; the error is the message for its line.
fn parse_row(line: &str, columns: usize) -> Result<Vec<f64>, String> {
    let row: Vec<f64> = line
        .split(',')
        .map(|f| f.parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not a number row: {e}"))?;
    // Every column is a count, a time or a flag: never negative, NaN or infinite.
    if let Some(v) = row.iter().find(|v| !v.is_finite() || **v < 0.0) {
        return Err(format!(
            "{v} is not a count or a time (a negative, NaN or infinite value)"
        ));
    }
    if row.len() != columns {
        return Err(format!("{} fields, the header has {}", row.len(), columns));
    }
    Ok(row)
}
