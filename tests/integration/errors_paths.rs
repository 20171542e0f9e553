//! Clear errors and exit codes for careless paths, flags a model cannot honour and contexts past what the model or memory takes.

use crate::common::{bmoe, bmoe_within, e8k2, smollm2, stderr};
use std::time::{Duration, Instant};

use super::errors::*;

/// Run bmoe with its fixture cache set to `cache` (or unset when None... set
/// to this exact value, which may be empty or a file).
fn bmoe_with_cache(args: &[&str], cache: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(args)
        .env("BMOE_CACHE_DIR", cache)
        .env_remove("RUST_LOG")
        .output()
        .expect("start bmoe")
}

#[test]
fn careless_paths_get_the_documented_code_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let fifo = d("fifo");
    let c = std::ffi::CString::new(fifo.clone()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (text, file) = (d("notes.gguf"), d("file"));
    std::fs::write(&text, "plain text\n").unwrap();
    std::fs::write(&file, "x").unwrap();
    let used = d("used");
    std::fs::create_dir_all(dir.path().join("used/runs")).unwrap();
    let (bad_cells, cold_cells) = (d("bad.cells"), d("cold.cells"));
    std::fs::write(&bad_cells, [b'a', b':', 0xff, 0xfe]).unwrap();
    std::fs::write(
        &cold_cells,
        "base: --cache-mb 64\ncold: --drop-cold-experts 5\n",
    )
    .unwrap();
    let m = crate::common::e8k2().to_str().unwrap();
    let sm = smollm2().to_str().unwrap();
    let tmp = dir.path().to_str().unwrap();
    let fresh = d("fresh");
    let o_gguf = d("o.gguf");
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["compare", "/dev/zero"], 2, "not a regular file"),
        (vec!["compare", tmp], 2, "not a regular file"),
        (
            vec!["run", "-m", m, "-p", "x", "--csv", &fifo],
            2,
            "not a regular file",
        ),
        (
            vec![
                "fixture",
                "upcycle",
                "--from",
                "/nonexistent.gguf",
                "-o",
                &o_gguf,
            ],
            3,
            "does not exist",
        ),
        (
            vec!["fixture", "upcycle", "--from", &text, "-o", &o_gguf],
            4,
            "not a gguf file",
        ),
        (
            vec!["fixture", "upcycle", "--from", sm, "-o", tmp],
            2,
            "is a directory",
        ),
        (vec!["bench", "-m", m, "-o", &file], 2, "is not a directory"),
        (
            vec!["bench", "-m", m, "-o", &used],
            2,
            "already holds a bench",
        ),
        (
            vec!["bench", "-m", m, "-o", &fresh, "--cells", &bad_cells],
            2,
            "not UTF-8",
        ),
        (
            vec!["bench", "-m", m, "-o", &fresh, "--cells", &cold_cells],
            2,
            "--drop-cold-experts 5",
        ),
    ];
    for (args, code, want) in cases {
        let o = crate::common::bmoe_within(&args, 30);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("probing"), "refused before measuring: {err}");
    }
    assert!(
        !dir.path().join("fresh").exists(),
        "no bench directory made"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial") || n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "nothing half-made left: {left:?}");
    // The fixture cache: empty or a file is refused, not used.
    for (cache, want) in [("", "set but empty"), (file.as_str(), "not a directory")] {
        let o = bmoe_with_cache(&["fixture", "smollm2"], cache);
        assert_eq!(o.status.code(), Some(2), "{cache:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{cache:?}: {}", stderr(&o));
    }
}

#[test]
fn flags_a_model_cannot_honour_are_refused_with_the_reason() {
    // --predict-prefetch needs an MoE layer followed by another; llama4's
    // alternate with dense ones.
    let llama4 = crate::common::zoo_model("llama4", "f32");
    let l4 = llama4.as_str();
    let o = bmoe(&["run", "-m", l4, "-p", "x", "-n", "2", "--predict-prefetch"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("llama4: no MoE layer is followed by another"),
        "{err}"
    );
    // -c 16 is rounded up to 256 by llama.cpp: a prompt over 256 tokens is
    // refused, and the message says why the context is 256.
    let long = "one two three four five six seven eight ".repeat(40);
    let m = crate::common::e8k2().to_str().unwrap();
    let o = bmoe(&["run", "-m", m, "-p", &long, "-c", "16"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("-c 16 was rounded up to 256"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_vocabulary_llama_cpp_would_abort_on_is_refused() {
    // Two tokens with the same string: llama.cpp asserts building its map.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("dup-vocab.gguf");
    // The header is enough: the vocabulary is checked before the tensors.
    let src = crate::common::e8k2();
    let header = bmoe::llama::gguf::GgufFile::open(src)
        .unwrap()
        .data_offset();
    let mut bytes = std::fs::read(src).unwrap();
    bytes.truncate(header as usize);
    // Token strings are stored as (u64 length, bytes): make the first "b"
    // token read "a" (both are one-byte tokens of the BPE vocabulary).
    let pat = |c: u8| {
        let mut v = 1u64.to_le_bytes().to_vec();
        v.push(c);
        v
    };
    let find = |b: &[u8], p: &[u8]| b.windows(p.len()).position(|w| w == p);
    assert!(find(&bytes, &pat(b'a')).is_some(), "token \"a\" present");
    let at = find(&bytes, &pat(b'b')).expect("token \"b\" present");
    bytes[at + 8] = b'a';
    std::fs::write(&p, &bytes).unwrap();
    let ps = p.to_str().unwrap();
    assert_fails(&["inspect", ps], 4, "the same string");
    assert_fails(
        &["run", "-m", ps, "-p", "hi", "-n", "1"],
        4,
        "the same string",
    );
}

#[test]
fn more_experts_per_token_than_the_graph_holds_is_refused_not_aborted() {
    // llama.cpp sizes its graph by the tensor count: on this 30-layer model,
    // 19 experts per token fail an assertion (exit 134) while building it.
    let m = crate::common::e20k2().to_str().unwrap();
    // Streamed (given: the model fits, so the default runs resident) and resident.
    for extra in [&["--cache-mb", "auto"][..], &["--resident"][..]] {
        let mut args = vec!["run", "-m", m, "-p", "The capital of France is", "-n", "2"];
        args.extend(["--n-expert-used", "20"]);
        args.extend(extra);
        let o = crate::common::bmoe_within(&args, 120);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("choose at most 18"), "{err}");
    }
    // The largest that fits runs.
    let o = bmoe(&[
        "run",
        "-m",
        m,
        "-p",
        "The capital of France is",
        "-n",
        "2",
        "--n-expert-used",
        "18",
        "--cache-mb",
        "auto",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn run_chat_and_serve_refuse_the_same_configuration_with_the_same_code() {
    // A dense model with --moe-stream: the engine refuses it while assembling,
    // whichever command runs the engine, and every command exits 2 (README,
    // "Exit codes").
    let m = smollm2().to_str().unwrap();
    let refused = ["-m", m, "--moe-stream"];
    let commands: [&[&str]; 3] = [
        &["run", "-p", "Hello", "-n", "2"],
        &["chat"],
        &["serve", "--port", "0"],
    ];
    for command in commands {
        let args = [command, &refused[..]].concat();
        let o = crate::common::bmoe_within(&args, 120);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "args {args:?}\n{err}");
        assert!(err.contains("drop --moe-stream"), "args {args:?}\n{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// A context longer than the model was trained for is refused at once with
/// the length that fits (exit 2), before llama.cpp allocates anything: it
/// once grew to 18 GB for `-c 1000000000` before the host killed it. (The
/// MemAvailable side of the check is the unit test
/// `engine::ctx_check::tests::a_context_that_does_not_fit_names_the_largest_that_does`.)
#[test]
fn a_context_longer_than_the_model_takes_is_refused_before_it_is_allocated() {
    let m = e8k2().to_str().unwrap();
    for c in ["1000000000", "4294967295", "9000"] {
        let t0 = std::time::Instant::now();
        let o = bmoe(&["run", "-m", m, "-p", "Hi", "-n", "2", "-c", c]);
        assert_eq!(o.status.code(), Some(2), "-c {c}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("training context (8192 tokens): give -c 8192 or less"),
            "-c {c}: {}",
            stderr(&o)
        );
        assert!(!stderr(&o).contains("llama.cpp"), "{}", stderr(&o));
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "-c {c}: refused without allocating ({:?})",
            t0.elapsed()
        );
    }
    let o = bmoe(&["chat", "-m", m, "-c", "9000"]);
    assert_eq!(o.status.code(), Some(2), "chat: {}", stderr(&o));
}

/// Make a FIFO at `path`.
pub(super) fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// A FIFO named as a trace or a warm profile is refused at once (it once
/// blocked in `open()` for good, deaf to SIGTERM).
#[test]
fn a_fifo_named_as_a_trace_or_a_profile_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let f = fifo.to_str().unwrap();
    let m = e8k2().to_str().unwrap();
    let run = ["run", "-m", m, "-p", "Hi", "-n", "2", "--cache-warm", f];
    for args in [&["replay", f][..], &run[..]] {
        let t0 = Instant::now();
        let o = bmoe_within(args, 60);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
        assert!(t0.elapsed() < Duration::from_secs(60), "{args:?}");
    }
}
