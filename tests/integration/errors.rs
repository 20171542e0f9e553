//! Clear errors and exit codes for bad input.

use std::io::Write;

use crate::common::{bmoe, smollm2, stderr};

pub(crate) fn assert_fails(args: &[&str], code: i32, needle: &str) {
    let o = bmoe(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(code), "args {args:?}\n{err}");
    assert!(
        err.contains(needle),
        "args {args:?}: {needle:?} not in\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn missing_model_file() {
    assert_fails(
        &["run", "-m", "/nonexistent/model.gguf", "-p", "hi"],
        3,
        "does not exist",
    );
    assert_fails(&["inspect", "/nonexistent/model.gguf"], 3, "does not exist");
}

#[test]
fn not_a_gguf_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("notes.gguf");
    std::fs::write(&p, b"this is plain text, not a model\n").unwrap();
    let ps = p.to_str().unwrap();
    assert_fails(&["run", "-m", ps, "-p", "hi"], 4, "is not a gguf file");
    assert_fails(&["inspect", ps], 4, "is not a gguf file");
}

#[test]
fn truncated_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("short.gguf");
    let full = std::fs::read(smollm2()).unwrap();
    std::fs::File::create(&p)
        .unwrap()
        .write_all(&full[..full.len() / 2])
        .unwrap();
    let ps = p.to_str().unwrap();
    assert_fails(&["run", "-m", ps, "-p", "hi"], 4, "is truncated");
    assert_fails(&["inspect", ps], 4, "is truncated");
}

#[test]
fn header_cut_inside_the_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cut.gguf");
    let full = std::fs::read(smollm2()).unwrap();
    std::fs::write(&p, &full[..4096]).unwrap();
    assert_fails(&["inspect", p.to_str().unwrap()], 4, "corrupt gguf header");
}

#[test]
fn zero_tokens_is_refused() {
    assert_fails(
        &[
            "run",
            "-m",
            smollm2().to_str().unwrap(),
            "-p",
            "hi",
            "-n",
            "0",
        ],
        2,
        "-n",
    );
}

#[test]
fn unknown_flag_is_refused() {
    assert_fails(&["run", "--no-such-flag", "-p", "hi"], 2, "--no-such-flag");
}

#[test]
fn prompt_and_file_conflict_and_one_is_required() {
    assert_fails(&["run", "-p", "a", "-f", "b"], 2, "cannot be used with");
    assert_fails(&["run", "-m", "x.gguf"], 2, "--prompt");
}

#[test]
fn prompt_longer_than_the_context() {
    let long = "word ".repeat(600);
    assert_fails(
        &[
            "run",
            "-m",
            smollm2().to_str().unwrap(),
            "-p",
            &long,
            "-c",
            "64",
        ],
        2,
        "raise -c/--ctx",
    );
}

/// Files in `dir` other than `keep` (a leftover temporary output would show here).
pub(crate) fn others(dir: &std::path::Path, keep: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !keep.contains(&n.as_str()))
        .collect()
}

#[test]
fn outputs_never_replace_inputs_or_a_file_before_the_run_measured() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let (model, prompt, csv, trace) = (d("victim.gguf"), d("pr.txt"), d("a.csv"), d("t.json"));
    std::fs::write(&model, b"GGUF not really a model, but precious").unwrap();
    std::fs::write(&prompt, "Once upon a time").unwrap();
    std::fs::write(&csv, "precious csv").unwrap();
    std::fs::write(&trace, "precious trace").unwrap();
    // An output naming an input is refused before anything is read or written.
    for (args, flag) in [
        (vec!["-m", &model, "-p", "x", "--csv", &model], "--csv"),
        (vec!["-m", &model, "-f", &prompt, "--csv", &prompt], "--csv"),
        (
            vec!["-m", &model, "-p", "x", "--trace-chrome", &model],
            "--trace-chrome",
        ),
    ] {
        let mut a = vec!["run"];
        a.extend(args.iter().copied());
        let o = bmoe(&a);
        assert_eq!(o.status.code(), Some(2), "{a:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(flag) && stderr(&o).contains("overwritten"),
            "{}",
            stderr(&o)
        );
    }
    assert_eq!(
        std::fs::read(&model).unwrap(),
        b"GGUF not really a model, but precious"
    );
    assert_eq!(
        std::fs::read_to_string(&prompt).unwrap(),
        "Once upon a time"
    );
    // A run that fails before it measured anything leaves existing outputs as they were.
    let missing = d("missing.gguf");
    let o = bmoe(&[
        "run",
        "-m",
        &missing,
        "-p",
        "x",
        "--csv",
        &csv,
        "--trace-chrome",
        &trace,
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&csv).unwrap(), "precious csv");
    let keep = ["victim.gguf", "pr.txt", "a.csv", "t.json"];
    assert!(
        others(dir.path(), &keep).is_empty(),
        "{:?}",
        others(dir.path(), &keep)
    );
}

#[test]
fn numeric_flags_that_would_overflow_or_exhaust_memory_are_refused() {
    let cases: [(&[&str], &str); 7] = [
        (
            &["run", "-p", "x", "--cache-mb", "17592186044416"],
            "does not fit in 64 bits",
        ),
        (
            &["run", "-p", "x", "--cache-ceil-mb", "18446744073709551615"],
            "0..=17592186044415",
        ),
        (
            &[
                "bench",
                "-o",
                "/nonexistent-bmoe-out",
                "--probe-depths",
                "100000",
            ],
            "1..=256",
        ),
        (
            &[
                "bench",
                "-o",
                "/nonexistent-bmoe-out",
                "--probe-depths",
                "0",
            ],
            "1..=256",
        ),
        (&["probe", "--depths", "4,0"], "1..=256"),
        (
            &[
                "bench",
                "-o",
                "/nonexistent-bmoe-out",
                "--until-stable",
                "0",
            ],
            "--until-stable 0: give the widest accepted",
        ),
        (
            &[
                "bench",
                "-o",
                "/nonexistent-bmoe-out",
                "--until-stable",
                "0.1",
                "-r",
                "5",
                "--max-repeats",
                "3",
            ],
            "--max-repeats 3 is below --repeats 5",
        ),
    ];
    for (args, want) in cases {
        let o = bmoe(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
}

#[test]
fn inputs_that_are_not_regular_text_files_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let fifo = d("fifo");
    let c = std::ffi::CString::new(fifo.clone()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (bad, missing, nul) = (d("bad.txt"), d("missing.txt"), d("nul.txt"));
    std::fs::write(&bad, [0xff, 0xfe]).unwrap();
    std::fs::write(&nul, b"hello\0world").unwrap();
    let tmp = dir.path().to_str().unwrap().to_string();
    let model = "/nonexistent-bmoe-model.gguf";
    // Each returns at once (a FIFO is never opened), with the code and the why.
    let cases: [(Vec<&str>, i32, &str); 8] = [
        (vec!["-m", model, "-f", &nul, "--chat"], 2, "NUL byte"),
        (vec!["-m", &tmp, "-p", "x"], 3, "is a directory"),
        (vec!["-m", &fifo, "-p", "x"], 3, "not a regular file"),
        (vec!["-m", model, "-f", &missing], 2, "does not exist"),
        (vec!["-m", model, "-f", &tmp], 2, "is a directory"),
        (vec!["-m", model, "-f", &fifo], 2, "not a regular file"),
        (vec!["-m", model, "-f", &bad], 2, "not UTF-8"),
        (vec!["-m", model, "-p", ""], 2, "the prompt is empty"),
    ];
    for (args, code, want) in cases {
        let mut a = vec!["run"];
        a.extend(args.iter().copied());
        let o = crate::common::bmoe_within(&a, 20);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{a:?}: {err}");
        assert!(err.contains(want), "{a:?}: {err}");
        let last = err.lines().last().unwrap_or("");
        assert_eq!(last.matches(want).count(), 1, "said once: {last}");
    }
    // More threads than cores: a warning with the consequence.
    let o = bmoe(&["run", "-m", model, "-p", "x", "-t", "256"]);
    assert!(
        stderr(&o).contains("-t 256 is more than the"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn logs_off_a_terminal_have_no_colours_and_a_no_op_flag_pair_is_refused() {
    let m = crate::common::e8k2().to_str().unwrap();
    let o = bmoe(&["run", "-m", m, "-p", "x", "-n", "1", "-v"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("DEBUG"), "debug logs shown: {err}");
    assert!(!err.contains('\u{1b}'), "no ANSI escapes on a pipe");
    let o = bmoe(&[
        "run",
        "-m",
        m,
        "-p",
        "x",
        "--mtp",
        "--head-predemand",
        "--resident",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("nothing is streamed"), "{}", stderr(&o));
}
