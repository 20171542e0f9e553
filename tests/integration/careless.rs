//! The third careless-use pass (docs/reliability.md): a chat that outlives a
//! bad input line, a `/save` that would replace the model, FIFOs named as a
//! trace or a warm profile, a refusal that prints no `BMOE_DONE`.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{bmoe, bmoe_within, e8k2, sha256, smollm2, stderr};

fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// A line that is not UTF-8 is skipped and the chat goes on; `/save` onto
/// the model is refused and the model stays as it was; a reply cut at `-n`
/// says so; one turn saved is "1 turn".
#[test]
fn a_chat_survives_bad_lines_and_never_saves_over_its_model() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("chat.json");
    let model = e8k2();
    let before = sha256(model);
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["chat", "-m", model.to_str().unwrap(), "-n", "2", "-t", "2"])
        .env("BMOE_CACHE_DIR", smollm2().parent().expect("cache dir"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bmoe chat");
    let mut input = b"\xff\xfe not text\nHi.\n".to_vec();
    input.extend(format!("/save {}\n", model.display()).as_bytes());
    input.extend(format!("/save {}\n/quit\n", saved.display()).as_bytes());
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("(that line is not UTF-8 text: skipped"),
        "{err}"
    );
    assert!(err.contains("(reply cut at 2 tokens"), "{err}");
    assert!(err.contains("own input"), "{err}");
    assert!(err.contains("(saved 1 turn to"), "{err}");
    assert_eq!(sha256(model), before, "the model is intact");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(json["messages"][0]["content"], "Hi.");
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

/// A refusal ran nothing: no `BMOE_DONE` line a script could take for a run.
#[test]
fn a_refused_run_prints_no_done_line() {
    let long = "word ".repeat(600);
    let o = bmoe(&[
        "run",
        "-m",
        e8k2().to_str().unwrap(),
        "-p",
        &long,
        "-c",
        "64",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!stderr(&o).contains("BMOE_DONE"), "{}", stderr(&o));
}

/// Each command's help lists only the flags it takes (chat and serve once
/// listed about 20 of run's that they then refused).
#[test]
fn each_commands_help_lists_only_what_it_takes() {
    let help = |cmd: &str| crate::common::stdout(&bmoe(&[cmd, "--help"]));
    let run = help("run");
    for flag in ["--prompt", "--csv", "--ngram", "--stop", "--show-prompt"] {
        assert!(run.contains(flag), "run --help: {flag}");
    }
    let (chat, serve) = (help("chat"), help("serve"));
    for flag in [
        "--prompt",
        "--file",
        "--chat ",
        "--csv",
        "--progress",
        "--route-trace",
        "--ngram",
        "--mtp",
        "--spec",
        "--draft",
        "--ignore-eos",
        "--show-prompt",
    ] {
        assert!(!chat.contains(flag), "chat --help lists {flag}:\n{chat}");
        assert!(!serve.contains(flag), "serve --help lists {flag}:\n{serve}");
    }
    assert!(!serve.contains("--stop"), "{serve}");
    assert!(
        chat.contains("--stop") && chat.contains("--system"),
        "{chat}"
    );
    for flag in ["--cache-mb", "--chat-template-file", "--temp"] {
        assert!(chat.contains(flag) && serve.contains(flag), "{flag}");
    }
}
