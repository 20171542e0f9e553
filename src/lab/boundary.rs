//! The lab's boundary, checked: no source file of the engine names the lab.
//! The engine is every `.rs` file under `src/` except the lab itself, the
//! binary's edge (`src/main.rs`, `src/cli.rs`, `src/cli/`) and the one line
//! of `src/lib.rs` that declares the module.

use std::path::{Path, PathBuf};

/// Where the lab may be named: its own tree and the binary's edge.
const ALLOWED: [&str; 4] = ["lab", "cli", "cli.rs", "main.rs"];

/// The declaration in `src/lib.rs`, the one engine line allowed to name it.
const DECLARATION: &str = "pub mod lab;";

/// The 1-based line of the first path in `source` that names the lab
/// (`lab::x`, `crate::lab`, `bmoe::lab`, `use crate::{lab, ..}`), comments
/// left out; `None` when there is none.
fn first_lab_path(source: &str) -> Option<usize> {
    let mut in_use = false;
    for (i, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if code.trim() == DECLARATION {
            continue;
        }
        if code
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == "use")
        {
            in_use = true;
        }
        if names_lab(code, in_use) {
            return Some(i + 1);
        }
        if in_use && code.contains(';') {
            in_use = false;
        }
    }
    None
}

/// Whether one line of code names the identifier `lab` as a path segment, or
/// anywhere inside a `use` statement.
fn names_lab(code: &str, in_use: bool) -> bool {
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    code.match_indices("lab").any(|(at, _)| {
        let end = at + 3;
        let alone = (at == 0 || !ident(bytes[at - 1])) && bytes.get(end).is_none_or(|&b| !ident(b));
        let path =
            code[end..].trim_start().starts_with("::") || code[..at].trim_end().ends_with("::");
        alone && (path || in_use)
    })
}

/// Every `.rs` file under `dir`, depth first.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries.map(|e| e.expect("a directory entry")) {
        let path = e.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_engine_file_names_the_lab() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for e in std::fs::read_dir(&src).expect("src/").map(|e| e.unwrap()) {
        let name = e.file_name();
        if ALLOWED.iter().any(|a| name == *a) {
            continue;
        }
        match e.path() {
            p if p.is_dir() => rust_files(&p, &mut files),
            p if p.extension().is_some_and(|x| x == "rs") => files.push(p),
            _ => {}
        }
    }
    assert!(files.len() > 20, "too few engine files found: {files:?}");
    let offenders: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{e}"));
            first_lab_path(&text).map(|l| format!("{}:{l}", f.display()))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "the engine must never import the lab (it may use the engine, not the other way): {offenders:?}"
    );
}

#[test]
fn every_way_of_naming_the_lab_is_caught() {
    for bad in [
        "use crate::lab::bench;",
        "use crate::lab;",
        "    let c = bmoe::lab::compare::RunCsv::open(p);",
        "use super::lab :: compare;",
        "use crate::{\n    engine,\n    lab,\n};",
        "pub(crate) use crate::{lab, stream};",
        "fn f() -> lab::bench::Cell { make() }",
        "#[cfg(test)] use crate::{lab, x};",
    ] {
        assert!(first_lab_path(bad).is_some(), "missed: {bad}");
    }
    assert_eq!(first_lab_path("fn a() {}\nuse crate::lab;"), Some(2));
    for fine in [
        "pub mod lab;",
        "// see crate::lab::bench for the harness",
        "let lab = 3; let label = lab + 1;",
        "use crate::{engine, label};",
        "let collab::x = 1;",
    ] {
        assert_eq!(first_lab_path(fine), None, "wrongly caught: {fine}");
    }
}
