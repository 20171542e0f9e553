//! Files a command writes at a path the user named: one check
//! (`checks::output_file`) refuses any that is one of the command's inputs,
//! named as it is, through a symlink or through a hard link, before any work.

use std::os::unix::fs::symlink;
use std::path::Path;

use crate::common::{bmoe_within, e8k2, smollm2, stderr};

/// Refused with exit 2, the flag and the input named, nothing written.
fn refused(args: &[&str], flag: &str, input: &Path) {
    let o = bmoe_within(args, 60);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.contains(&format!("{flag} ")) && err.contains("own input"),
        "{args:?}: {err}"
    );
    assert!(
        err.contains(&input.display().to_string()),
        "{args:?} names {}: {err}",
        input.display()
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn no_command_writes_over_its_own_input() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let s = |n: &str| p(n).to_str().unwrap().to_string();
    let log_text = "{\"layer\": 0, \"experts\": [1, 2]}\n{\"layer\": 1, \"experts\": [3, 0]}\n";
    std::fs::write(p("log.jsonl"), log_text).unwrap();
    symlink(p("log.jsonl"), p("log-link.jsonl")).unwrap();
    std::fs::hard_link(p("log.jsonl"), p("log-hard.jsonl")).unwrap();
    // The models through symlinks: were the check to fail, the link would
    // be replaced, never the shared fixture.
    symlink(e8k2(), p("m.gguf")).unwrap();
    symlink(smollm2(), p("dense.gguf")).unwrap();
    let model_bytes = std::fs::metadata(e8k2()).unwrap().len();
    let (log, m, dense) = (s("log.jsonl"), s("m.gguf"), s("dense.gguf"));
    // trace import over its model (the 27 MB gguf once became a 234-byte
    // trace) or over its log, by name, symlink or hard link.
    let import = |out: &str| -> Vec<String> {
        ["trace", "import", &log, "--like", &m, "-o", out]
            .map(String::from)
            .to_vec()
    };
    for (out, input) in [
        (m.clone(), p("m.gguf")),
        (log.clone(), p("log.jsonl")),
        (s("log-link.jsonl"), p("log.jsonl")),
        (s("log-hard.jsonl"), p("log.jsonl")),
    ] {
        let args = import(&out);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&args, "-o", &input);
    }
    // A fixture over the model it is built from.
    refused(
        &["fixture", "upcycle", "--from", &dense, "-o", &dense],
        "-o",
        &p("dense.gguf"),
    );
    refused(
        &[
            "fixture",
            "tiny-mtp",
            "--tokenizer-from",
            &dense,
            "-o",
            &dense,
        ],
        "-o",
        &p("dense.gguf"),
    );
    // A bench whose prompt file is the prompt.txt it writes in -o.
    std::fs::create_dir(p("out")).unwrap();
    std::fs::write(p("out/prompt.txt"), "my own prompt").unwrap();
    let (prompt, out) = (s("out/prompt.txt"), s("out"));
    refused(
        &["bench", "-m", &m, "-w", &prompt, "-o", &out],
        "-o",
        &p("out/prompt.txt"),
    );
    // The global --trace-chrome over any command's input.
    refused(
        &[
            "--trace-chrome",
            &log,
            "trace",
            "import",
            &log,
            "--slot-bytes",
            "10",
            "-o",
            &s("t"),
        ],
        "--trace-chrome",
        &p("log.jsonl"),
    );
    refused(
        &["--trace-chrome", &m, "inspect", &m],
        "--trace-chrome",
        &p("m.gguf"),
    );
    // Every input as it was.
    assert_eq!(std::fs::read_to_string(p("log.jsonl")).unwrap(), log_text);
    assert!(std::fs::symlink_metadata(p("log-link.jsonl"))
        .unwrap()
        .file_type()
        .is_symlink());
    for link in ["m.gguf", "dense.gguf"] {
        let meta = std::fs::symlink_metadata(p(link)).unwrap();
        assert!(meta.file_type().is_symlink(), "{link} still the link");
    }
    assert_eq!(std::fs::metadata(e8k2()).unwrap().len(), model_bytes);
    assert_eq!(
        std::fs::read_to_string(p("out/prompt.txt")).unwrap(),
        "my own prompt"
    );
    assert!(
        !p("out/runs").exists() && !p("t").exists(),
        "nothing written"
    );
    // A new path is written as before.
    let o = bmoe_within(
        &import(&s("new.bmrt"))
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        60,
    );
    assert!(o.status.success(), "{}", stderr(&o));
}
