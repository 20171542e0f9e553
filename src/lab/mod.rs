//! The lab: the measurement harness, beside the engine and never inside it.
//!
//! [`bench`] runs matrices of runs interleaved against the host's physical
//! bound (host conditions, busy neighbours, smaller-host balloons, end-to-end
//! tables); [`compare`] turns run CSVs into ratios with intervals. The lab may
//! use the engine (layouts, probes, the `bmoe` binary as a child); the engine
//! never uses the lab: only the command line (`src/cli`, `src/main.rs`) and the
//! tests name it, and the test below keeps it so.

pub mod bench;
pub mod compare;

#[cfg(test)]
mod boundary {
    use std::path::{Path, PathBuf};

    /// Where the lab may be named: the lab itself and the command line.
    const ALLOWED: [&str; 4] = ["src/lab", "src/cli", "src/cli.rs", "src/main.rs"];

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read src").flatten() {
            let p = e.path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// The lines of `text` that name the lab module.
    fn lab_uses(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|l| l.contains("lab::") && !l.trim_start().starts_with("//"))
            .collect()
    }

    #[test]
    fn the_engine_never_imports_the_lab() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        rust_files(&root.join("src"), &mut files);
        assert!(files.len() > 50, "found only {} sources", files.len());
        let mut offenders = Vec::new();
        for f in files {
            let rel = f.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if ALLOWED.iter().any(|a| rel.starts_with(a)) {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            offenders.extend(lab_uses(&text).iter().map(|l| format!("{rel}: {l}")));
        }
        assert!(
            offenders.is_empty(),
            "the engine names the lab:\n{}",
            offenders.join("\n")
        );
    }

    #[test]
    fn a_lab_import_is_seen() {
        assert_eq!(
            lab_uses("use crate::lab::bench;\n// lab:: in a comment").len(),
            1
        );
        assert_eq!(lab_uses("let x = bmoe::lab::compare::x();").len(), 1);
        assert!(lab_uses("use crate::stream;").is_empty());
    }
}
