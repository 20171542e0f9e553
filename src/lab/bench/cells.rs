//! The cells of a bench matrix: parsing a cells file (`name: flags` lines)
//! and the built-in presets.

use super::error::BenchError;
use crate::stream::StreamConfig;

/// One configuration of the matrix: a name, the `bmoe run` flags, and what
/// `bmoe run`'s own parse of them settled.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub name: String,
    pub args: Vec<String>,
    pub settings: CellSettings,
}

/// What a cell's flags come to, as `bmoe run` parses them (the CLI's clap
/// parse and checks, handed in as a [`Settle`]): the lab reads these, never
/// the flags themselves, so a default is the run's own.
#[derive(Debug, Clone, PartialEq)]
pub struct CellSettings {
    /// `-c`, the context in tokens.
    pub n_ctx: u32,
    /// The streaming settings; None for a `--resident` cell.
    pub stream: Option<StreamConfig>,
}

/// `bmoe run`'s parse and checks of one cell's flags: its settings, or the
/// refusal in words.
pub type Settle<'a> = &'a dyn Fn(&[String]) -> Result<CellSettings, String>;

/// Split a flag line into arguments: whitespace-separated, with `"..."` or
/// `'...'` quoting (no escapes).
pub fn split_args(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for ch in s.chars() {
        match quote {
            Some(q) if ch == q => quote = None,
            Some(_) => cur.push(ch),
            None if ch == '"' || ch == '\'' => {
                quote = Some(ch);
                in_word = true;
            }
            None if ch.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None => {
                cur.push(ch);
                in_word = true;
            }
        }
    }
    if let Some(q) = quote {
        return Err(format!("unterminated {q} quote"));
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Flags a cell may not set: the bench owns them (same model, prompt, token
/// count and CSV path for every cell).
const OWNED_FLAGS: &[&str] = &[
    "-m",
    "--model",
    "-p",
    "--prompt",
    "-f",
    "--file",
    "-n",
    "--n-predict",
    "--csv",
    "--progress",
    "--ignore-eos",
];

/// Parse a cells file: one `name: flags` per line, `#` comments, blank lines
/// ignored. The first cell is the baseline.
pub fn parse_cells(
    source_name: &str,
    text: &str,
    settle: Settle<'_>,
) -> Result<Vec<Cell>, BenchError> {
    let mut cells: Vec<Cell> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let err = |msg: String| BenchError::Cells {
            source_name: source_name.to_string(),
            line: i + 1,
            msg,
        };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, flags) = line.split_once(':').ok_or_else(|| {
            err("expected `name: flags` (e.g. `c0-overlap: --cache-mb 0 --overlap`)".into())
        })?;
        let name = name.trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(err(format!(
                "cell name {name:?}: use letters, digits, '-', '_' or '.' (it names the CSV)"
            )));
        }
        if cells.iter().any(|c| c.name == name) {
            return Err(err(format!("cell {name:?} is defined twice")));
        }
        let args = split_args(flags).map_err(err)?;
        if let Some(f) = args.iter().find(|a| {
            OWNED_FLAGS
                .iter()
                .any(|o| *a == o || a.starts_with(&format!("{o}=")))
        }) {
            return Err(err(format!(
                "{f} is set by the bench for every cell (--model, --workload, --tokens, -o, --ignore-eos)"
            )));
        }
        let settings =
            settle(&args).map_err(|e| err(format!("cell {name:?} ({}): {e}", args.join(" "))))?;
        cells.push(Cell {
            name: name.to_string(),
            args,
            settings,
        });
    }
    if cells.is_empty() {
        return Err(BenchError::Cells {
            source_name: source_name.to_string(),
            line: text.lines().count(),
            msg: "no cells (one `name: flags` per line)".into(),
        });
    }
    Ok(cells)
}

/// The widest context any cell runs with, as the flags to pass the resident
/// probe run (its prompt has to fit the same context).
pub(crate) fn widest_context(cells: &[Cell]) -> Option<[String; 2]> {
    let widest = cells.iter().map(|c| c.settings.n_ctx).max();
    widest.map(|n| ["-c".to_string(), n.to_string()])
}

/// The read queue depths the streamed cells use (`--io-threads`, default the
/// run's), sorted and distinct; the probe measures these.
pub fn cell_depths(cells: &[Cell]) -> Vec<u32> {
    let mut depths: Vec<u32> = cells
        .iter()
        .filter_map(|c| c.settings.stream.as_ref().map(|s| s.io_threads))
        .collect();
    depths.sort_unstable();
    depths.dedup();
    depths
}

/// The built-in matrices: (name, what it answers, cells file text).
pub const PRESETS: &[(&str, &str, &str)] = &[
    (
        "cache",
        "hit rate and tok/s over the cache budget (0, 10, 25, 50, 100% of the expert bytes) \
         for serial, overlap and overlap + predictive prefetch",
        "c0-serial: --cache-mb 0\n\
         c0-overlap: --cache-mb 0 --overlap\n\
         c0-predict: --cache-mb 0 --overlap --predict-prefetch\n\
         c10-serial: --cache-mb 10%\n\
         c10-overlap: --cache-mb 10% --overlap\n\
         c10-predict: --cache-mb 10% --overlap --predict-prefetch\n\
         c25-serial: --cache-mb 25%\n\
         c25-overlap: --cache-mb 25% --overlap\n\
         c25-predict: --cache-mb 25% --overlap --predict-prefetch\n\
         c50-serial: --cache-mb 50%\n\
         c50-overlap: --cache-mb 50% --overlap\n\
         c50-predict: --cache-mb 50% --overlap --predict-prefetch\n\
         c100-serial: --cache-mb 100%\n\
         c100-overlap: --cache-mb 100% --overlap\n\
         c100-predict: --cache-mb 100% --overlap --predict-prefetch\n\
         resident: --resident\n",
    ),
    (
        "overlap",
        "the lossless overlap and prefetch recipes with no cache (--cache-mb 0)",
        "c0-serial: --cache-mb 0\n\
         c0-overlap: --cache-mb 0 --overlap\n\
         c0-prefetch1: --cache-mb 0 --overlap --prefetch 1\n\
         c0-predict: --cache-mb 0 --predict-prefetch\n\
         c0-overlap-predict: --cache-mb 0 --overlap --predict-prefetch\n\
         c0-overlap-predict-t1: --cache-mb 0 --overlap --predict-prefetch -t 1\n\
         resident: --resident\n",
    ),
    (
        "bigger-than-ram",
        "a model file larger than the host's memory (e.g. fixture upcycle --experts 640): \
         llama.cpp's mmap path against the streamed recipes, the cache sized by auto",
        "mmap: --resident\n\
         c0-overlap-predict: --cache-mb 0 --overlap --predict-prefetch\n\
         auto-serial: --cache-mb auto\n\
         auto-overlap-predict: --cache-mb auto --overlap --predict-prefetch\n",
    ),
    (
        "small-host",
        "llama.cpp's mmap path (the baseline) against streaming, for use with --ram-limit-mb",
        "mmap: --resident\n\
         c0-overlap-predict-t1: --cache-mb 0 --overlap --predict-prefetch -t 1\n\
         c25-overlap-predict: --cache-mb 25% --overlap --predict-prefetch\n\
         auto-overlap-predict: --cache-mb auto --overlap --predict-prefetch\n",
    ),
    (
        "spec",
        "n-gram speculation against no speculation, resident (run it with -w copy and -w prose)",
        "off: --resident\n\
         ngram-d1: --resident --ngram --draft 1\n\
         ngram-d2: --resident --ngram --draft 2\n\
         ngram-d3: --resident --ngram --draft 3\n\
         ngram-d4: --resident --ngram --draft 4\n",
    ),
    (
        "spec-stream",
        "n-gram speculation streamed (25% cache, overlap): off against draft widths 1-4",
        "off: --cache-mb 25% --overlap\n\
         ngram-d1: --cache-mb 25% --overlap --ngram --draft 1\n\
         ngram-d2: --cache-mb 25% --overlap --ngram --draft 2\n\
         ngram-d3: --cache-mb 25% --overlap --ngram --draft 3\n\
         ngram-d4: --cache-mb 25% --overlap --ngram --draft 4\n",
    ),
    (
        "prefill",
        "the prompt's pass (run it with -w p64, -w p512, -w p2048 or -w long): resident against \
         streamed at no cache, 25% and auto, each prompt in one micro-batch (--ubatch auto) and \
         in micro-batches of 512 (the old default)",
        "resident: --resident -c 4096\n\
         c0: --cache-mb 0 -c 4096\n\
         c25: --cache-mb 25% -c 4096\n\
         auto: --cache-mb auto -c 4096\n\
         resident-ub512: --resident --ubatch 512 -c 4096\n\
         c0-ub512: --cache-mb 0 --ubatch 512 -c 4096\n",
    ),
    (
        "lossy",
        "the two lossy knobs against the lossless serial run at --cache-mb 0",
        "c0-serial: --cache-mb 0\n\
         c0-drop075: --cache-mb 0 --drop-cold-experts 0.75\n\
         c0-top2: --cache-mb 0 --n-expert-used 2\n",
    ),
];

/// The cells of a preset.
pub fn preset(name: &str, settle: Settle<'_>) -> Result<Vec<Cell>, BenchError> {
    match PRESETS.iter().find(|p| p.0 == name) {
        Some((n, _, text)) => parse_cells(&format!("preset {n}"), text, settle),
        None => Err(BenchError::Preset {
            name: name.to_string(),
            known: PRESETS.iter().map(|p| p.0).collect::<Vec<_>>().join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every cell taken, streamed with the defaults (the CLI's real parse is
    /// tested in `cli::commands`).
    fn taken(_: &[String]) -> Result<CellSettings, String> {
        Ok(CellSettings {
            n_ctx: 2048,
            stream: Some(StreamConfig::default()),
        })
    }

    #[test]
    fn split_args_handles_quotes_and_spaces() {
        assert_eq!(
            split_args("  --cache-mb 0   --overlap ").unwrap(),
            vec!["--cache-mb", "0", "--overlap"]
        );
        assert_eq!(
            split_args("--inject-faults 'seed=1, eio=0.1' -x\"a b\"").unwrap(),
            vec!["--inject-faults", "seed=1, eio=0.1", "-xa b"]
        );
        assert_eq!(split_args("\"\"").unwrap(), vec![""]);
        assert!(split_args("--a 'open").is_err());
    }

    #[test]
    fn cells_parse_with_comments_and_refuse_bad_lines() {
        let c = parse_cells(
            "f",
            "# the baseline first\nserial: --cache-mb 0\n\nov: --cache-mb 0 --overlap\n",
            &taken,
        )
        .unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].name, "serial");
        assert_eq!(c[1].args, vec!["--cache-mb", "0", "--overlap"]);
        let e = parse_cells("f", "a: --overlap\na: --resident\n", &taken).unwrap_err();
        assert!(
            e.to_string().contains("f:2") && e.to_string().contains("twice"),
            "{e}"
        );
        let e = parse_cells("f", "no colon here\n", &taken).unwrap_err();
        assert!(e.to_string().contains("f:1"), "{e}");
        let e = parse_cells("f", "x/y: --overlap\n", &taken).unwrap_err();
        assert!(e.to_string().contains("cell name"), "{e}");
        let e = parse_cells("f", "a: --model other.gguf\n", &taken).unwrap_err();
        assert!(e.to_string().contains("set by the bench"), "{e}");
        let e = parse_cells("f", "a: --csv=x.csv\n", &taken).unwrap_err();
        assert!(e.to_string().contains("set by the bench"), "{e}");
        assert!(parse_cells("f", "# nothing\n", &taken).is_err());
    }

    #[test]
    fn a_refused_cell_is_named_with_its_line_and_flags() {
        let refuse = |_: &[String]| -> Result<CellSettings, String> { Err("no".into()) };
        let e = parse_cells("f", "a: --overlap\n", &refuse)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("f:1") && e.contains("\"a\" (--overlap): no"),
            "{e}"
        );
    }

    #[test]
    fn every_preset_parses_and_unknown_ones_are_named() {
        for (name, _, _) in PRESETS {
            assert!(!preset(name, &taken).unwrap().is_empty());
        }
        let cache = preset("cache", &taken).unwrap();
        assert_eq!(cache.len(), 16);
        assert!(cache.iter().any(|c| c.args.contains(&"25%".to_string())));
        let e = preset("nope", &taken).unwrap_err().to_string();
        assert!(e.contains("cache") && e.contains("small-host"), "{e}");
    }
}
