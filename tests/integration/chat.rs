//! `bmoe chat` under a pseudo-terminal (rexpect): two turns, the second
//! decoding only its new tokens (the prefill count in /stats), Ctrl-C
//! mid-reply stopping the reply and not the program, /reset, /save, Ctrl-D.

use std::io::Write;
use std::process::{Command, Stdio};

use rexpect::session::{spawn_command, PtySession};

use super::common::{e8k2, sha256, smollm2, stderr, stdout};

/// The prompt's tokens, those reused from the KV cache and those prefilled,
/// from the `last turn:` line of /stats.
fn last_turn(p: &mut PtySession) -> (u64, u64, u64) {
    p.send_line("/stats").unwrap();
    let (_, line) = p
        .exp_regex(r"last turn: prompt \d+ tokens \(\d+ reused from the KV cache, \d+ prefilled\)")
        .expect("the /stats line");
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    p.exp_string("> ").unwrap();
    (n[0], n[1], n[2])
}

/// `bmoe chat` on E8K2 (`-c 1024 -t 2` and `args`), at its first prompt.
fn chat_on(args: &[&str]) -> PtySession {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bmoe"));
    cmd.args(["chat", "-m", e8k2().to_str().unwrap()])
        .args(["-c", "1024", "-t", "2"])
        .args(args)
        .env("BMOE_CACHE_DIR", smollm2().parent().expect("cache dir"))
        .env_remove("RUST_LOG");
    let mut p = spawn_command(cmd, Some(400_000)).expect("start bmoe chat");
    p.exp_string("> ").unwrap();
    p
}

#[test]
fn chat_reuses_the_history_stops_a_reply_on_ctrl_c_and_resets() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("chat.json");
    let mut p = chat_on(&["-n", "32", "--system", "You are a storyteller."]);
    p.send_line("Hi.").unwrap();
    p.exp_string("> ").unwrap();
    let (first, reused, _) = last_turn(&mut p);
    assert_eq!(reused, 0, "the first turn prefills everything");
    p.send_line("Tell me more.").unwrap();
    p.exp_string("> ").unwrap();
    let (second, reused, prefilled) = last_turn(&mut p);
    assert!(second > first);
    assert!(
        reused >= first - 1,
        "the first turn's prompt comes from the KV cache: {reused} of {second}"
    );
    assert_eq!(reused + prefilled, second);
    assert!(
        prefilled < second - first + 8,
        "only the new turn's tokens (and the reply's tail) are decoded: {prefilled}"
    );

    // Ctrl-C while the model writes: the reply stops, the program goes on.
    // Ctrl-C as soon as the reply's first word shows (past the echoed line),
    // with most of its 32 tokens still to come.
    p.send_line("Write a very long story about the sea.")
        .unwrap();
    p.exp_string("the sea.").unwrap();
    p.exp_regex(r"[[:alnum:]]").unwrap();
    p.send_control('c').unwrap();
    let before = p.exp_string("(reply stopped)").unwrap();
    assert!(
        !before.contains("ERROR"),
        "a deliberate stop shows no llama.cpp error lines: {before}"
    );
    p.exp_string("> ").unwrap();
    p.send_line(&format!("/save {}", saved.display())).unwrap();
    p.exp_string("(saved 3 turns").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("/reset").unwrap();
    p.exp_string("(conversation forgotten)").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("Hi.").unwrap();
    p.exp_string("> ").unwrap();
    let (after_reset, reused, _) = last_turn(&mut p);
    assert_eq!(
        (after_reset, reused),
        (first, 0),
        "after /reset the first turn is prefilled anew"
    );
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let messages = json["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(messages[1]["content"], "Hi.");
    assert_eq!(
        messages.len(),
        7,
        "system, three user messages and three replies"
    );
}

/// Templates that once rendered stray whitespace growing with the turns
/// (no trim_blocks/lstrip_blocks): the second turn's prompt starts with the
/// first turn's, so its KV entries are reused (the few tokens after the
/// assistant's opening differ where a template writes a past reply
/// otherwise than the turn it opened, e.g. an empty reasoning block).
#[test]
fn a_second_turn_reuses_the_first_on_real_templates() {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/templates/");
    for file in [
        "GLM-4.6.jinja",
        "MiniMax-M2.jinja",
        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
    ] {
        let template = format!("{data}{file}");
        let mut p = chat_on(&["-n", "8", "--chat-template-file", &template]);
        p.send_line("Hi.").unwrap();
        p.exp_string("> ").unwrap();
        let (first, _, _) = last_turn(&mut p);
        p.send_line("Tell me more.").unwrap();
        p.exp_string("> ").unwrap();
        let (second, reused, _) = last_turn(&mut p);
        eprintln!("{file}: first turn {first} tokens, second {second}, {reused} reused");
        assert!(second > first, "{file}");
        assert!(
            reused + 4 >= first,
            "{file}: the second turn reuses the first turn's prompt: {reused} of {first}"
        );
        p.send_control('d').unwrap();
        p.exp_eof().unwrap();
    }
}

/// Chat templates that never end well without limits (issue 48): a string
/// doubled forty times (23.7 GB), `indent` and `tojson` widths of 10**10 and
/// 10**9, three nested loops of 100000; and the limit each is refused with.
pub const HOSTILE_TEMPLATES: [(&str, &str, &str); 4] = [
    (
        "doubling",
        "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        "memory limit",
    ),
    ("indent", "{{ 'a'|indent(10**10) }}", "memory limit"),
    (
        "tojson",
        "{{ messages|tojson(indent=10**9) }}",
        "memory limit",
    ),
    (
        "loops",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}{% endfor %}{% endfor %}{% endfor %}",
        "step budget",
    ),
];

/// A template that renders for minutes within the step budget: each of
/// its 100000 steps replaces every letter of a 10 MB string.
pub const SLOW_TEMPLATE: &str = "{% set big = 'a' * 10000000 %}{% for i in range(100000) %}{{ (big|replace('a', 'b'))|length }}{% endfor %}";

/// `source` written as a template file in `dir`.
pub fn template_file(dir: &std::path::Path, name: &str, source: &str) -> String {
    let p = dir.join(format!("{name}.jinja"));
    std::fs::write(&p, source).expect("write the template");
    p.to_str().expect("UTF-8 path").to_string()
}

/// The largest resident set of any child this process has waited for, in bytes.
fn children_peak_rss_bytes() -> u64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
        u
    };
    u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024
}

/// Each hostile template is refused with the limit it ran past (exit 2, the
/// limit named), within 30 s and 2 GB, and no prompt is printed.
#[test]
fn hostile_templates_are_refused_with_the_limit_they_hit() {
    let dir = tempfile::tempdir().unwrap();
    let m = smollm2().to_str().unwrap();
    for (name, source, limit) in HOSTILE_TEMPLATES {
        let t = template_file(dir.path(), name, source);
        let args = ["run", "-m", m, "--chat", "-p", "Hi", "--show-prompt"];
        let o =
            super::common::bmoe_within(&[&args[..], &["--chat-template-file", &t]].concat(), 30);
        let err = super::common::stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(&format!("the chat template ran past its {limit}")),
            "{name}: {err}"
        );
        assert!(o.stdout.is_empty(), "{name}: no prompt");
        let peak = children_peak_rss_bytes();
        assert!(peak < 2 << 30, "{name}: peak RSS {peak} bytes");
    }
}

/// A template that renders for minutes within the step budget is stopped at
/// the time limit (10 s), exit 2, the limit named.
#[test]
fn a_slow_template_is_refused_at_the_time_limit() {
    let dir = tempfile::tempdir().unwrap();
    let t = template_file(dir.path(), "slow", SLOW_TEMPLATE);
    let m = smollm2().to_str().unwrap();
    let args = ["run", "-m", m, "--chat", "-p", "Hi", "--show-prompt"];
    let o = super::common::bmoe_within(&[&args[..], &["--chat-template-file", &t]].concat(), 30);
    let err = super::common::stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the chat template ran past its time limit (10 s)"),
        "{err}"
    );
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
    let mut input = b"\xff\xfe not text\nHi.\n".to_vec();
    input.extend(format!("/save {}\n", model.display()).as_bytes());
    input.extend(format!("/save {}\n/quit\n", saved.display()).as_bytes());
    let o = chat_piped(&["-n", "2"], &input);
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

/// `bmoe chat` on E8K2 (`-t 2` and `args`) fed `input` on a pipe.
fn chat_piped(args: &[&str], input: &[u8]) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["chat", "-m", e8k2().to_str().unwrap(), "-t", "2"])
        .args(args)
        .env("BMOE_CACHE_DIR", smollm2().parent().expect("cache dir"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bmoe chat");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// `/save FILE` keeps the KV state beside the transcript and `--resume FILE`
/// continues the conversation prefilling only the new message, with the text
/// of a chat that never stopped; a damaged state is a warning and a prefill
/// of the same text; a missing or malformed transcript is a usage error.
#[test]
fn a_resumed_chat_prefills_only_its_new_message_and_writes_the_same_text() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("chat.json");
    let state = dir.path().join("chat.json.kv");
    let sys = ["-n", "8", "--system", "You are a storyteller."];
    let whole = chat_piped(&sys, b"Hi.\nTell me more.\n/quit\n");
    assert!(whole.status.success(), "{}", stderr(&whole));
    let save = format!("Hi.\n/save {}\n/quit\n", saved.display());
    let first = chat_piped(&sys, save.as_bytes());
    let err = stderr(&first);
    assert!(err.contains("(saved 1 turn to"), "{err}");
    assert!(err.contains("the KV state of its"), "{err}");
    assert!(state.exists(), "{err}");

    let resume = ["-n", "8", "--resume", saved.to_str().unwrap()];
    let second = chat_piped(&resume, b"Tell me more.\n/stats\n/quit\n");
    let err = stderr(&second);
    assert!(second.status.success(), "{err}");
    assert!(err.contains("(resumed 1 turn from"), "{err}");
    assert!(err.contains("tokens of KV state restored"), "{err}");
    let stats = err
        .lines()
        .find(|l| l.starts_with("last turn: prompt"))
        .expect("a /stats line");
    let n: Vec<u64> = stats
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let (prompt, reused, prefilled) = (n[0], n[1], n[2]);
    assert!(reused > 0 && prefilled < 24, "{stats}");
    assert_eq!(reused + prefilled, prompt, "{stats}");
    let joined = format!("{}{}", stdout(&first), stdout(&second));
    assert_eq!(
        joined,
        stdout(&whole),
        "the resumed reply is the unbroken chat's"
    );

    // A damaged state: a warning, the conversation prefilled, the same text.
    let mut bytes = std::fs::read(&state).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&state, &bytes).unwrap();
    let damaged = chat_piped(&resume, b"Tell me more.\n/quit\n");
    let err = stderr(&damaged);
    assert!(damaged.status.success(), "{err}");
    assert!(err.contains("damaged"), "{err}");
    assert!(
        err.contains("the next turn prefills the conversation"),
        "{err}"
    );
    assert_eq!(stdout(&damaged), stdout(&second));

    // In the state's place a file that is not one: left as it is, said.
    std::fs::write(&state, "my notes").unwrap();
    let o = chat_piped(&sys, save.as_bytes());
    let err = stderr(&o);
    assert!(err.contains("not a bmoe prompt cache file"), "{err}");
    assert_eq!(std::fs::read_to_string(&state).unwrap(), "my notes");

    // No transcript, or not one: exit 2 naming the fix; --system with it too.
    let missing = dir.path().join("none.json");
    let o = chat_piped(&["--resume", missing.to_str().unwrap()], b"/quit\n");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("give a file /save wrote"),
        "{}",
        stderr(&o)
    );
    let o = chat_piped(&["--resume", state.to_str().unwrap()], b"/quit\n");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not a bmoe chat transcript"),
        "{}",
        stderr(&o)
    );
    let both = ["--resume", saved.to_str().unwrap(), "--system", "Be brief."];
    let o = chat_piped(&both, b"/quit\n");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
}

/// Issue 64, finding 6: `/save` onto a file that is not a transcript (notes,
/// another model, the chat's own `--chat-template-file`) leaves it as it is.
#[test]
fn save_never_writes_over_a_file_that_is_not_a_transcript() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    let other = dir.path().join("other-model.gguf");
    std::fs::write(&notes, "my notes").unwrap();
    std::fs::write(&other, "GGUF and weights").unwrap();
    let source = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}\
                  {% if add_generation_prompt %}<|assistant|>{% endif %}";
    let template = template_file(dir.path(), "template", source);
    let mut input = b"Hi.\n".to_vec();
    for f in [notes.to_str().unwrap(), other.to_str().unwrap(), &template] {
        input.extend(format!("/save {f}\n").as_bytes());
    }
    input.extend(b"/quit\n");
    let o = chat_piped(&["-n", "2", "--chat-template-file", &template], &input);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(
        err.matches("is not a bmoe chat transcript").count(),
        2,
        "{err}"
    );
    assert!(err.contains("own input"), "{err}");
    assert!(!err.contains("(saved"), "{err}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes");
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "GGUF and weights");
    assert_eq!(std::fs::read_to_string(&template).unwrap(), source);
}

/// Issue 64, finding 4: `--resume` of a FIFO or of /dev/zero is refused at
/// once with exit 2 (it blocked past SIGTERM, or read until memory ran out).
#[test]
fn resume_refuses_a_fifo_or_a_device_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("chat.json");
    super::errors_paths::mkfifo(&fifo);
    for file in [fifo.to_str().unwrap(), "/dev/zero"] {
        let m = e8k2().to_str().unwrap();
        let o = super::common::bmoe_within(&["chat", "-m", m, "--resume", file], 20);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{file}: {err}");
        assert!(err.contains("not a regular file"), "{file}: {err}");
    }
}

/// `bmoe chat --ngram` (issue 74): the first reply is the text `bmoe run
/// --chat --ngram` writes for the same message; the second turn drafts on a
/// prefix reused from the KV cache, and /stats counts the drafts kept (the
/// text may differ from chat's own without drafts at a near tie: a verify
/// row is not bit-identical to one row). --mtp is not chat's flag.
#[test]
fn chat_with_ngram_drafts_writes_runs_text_and_refuses_the_head() {
    let msg = "Copy this line exactly: def distance(a, b): dx = a.x - b.x; \
               dy = a.y - b.y; return math.sqrt(dx * dx + dy * dy)";
    let input = format!("{msg}\n/stats\nAgain, exactly.\n/stats\n/quit\n");
    let drafted = chat_piped(&["-n", "48", "--ngram"], input.as_bytes());
    assert!(drafted.status.success(), "{}", stderr(&drafted));
    let m = e8k2().to_str().unwrap();
    let args = ["run", "-m", m, "-t", "2", "--chat", "--ngram", "-n", "48"];
    let run = super::common::bmoe(&[&args[..], &["-p", msg]].concat());
    assert!(run.status.success(), "{}", stderr(&run));
    let first = stdout(&run);
    assert!(
        stdout(&drafted).starts_with(first.trim_end()),
        "chat's first reply is run's text: {first:?} / {:?}",
        stdout(&drafted)
    );
    let err = stderr(&drafted);
    let turns: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("last turn:"))
        .collect();
    assert_eq!(turns.len(), 2, "{err}");
    assert!(
        turns[1].contains("reused from the KV cache"),
        "{}",
        turns[1]
    );
    for t in &turns {
        let kept = t.split("drafts: ").nth(1).expect("a drafts figure");
        let accepted: u64 = kept.split(' ').next().unwrap().parse().unwrap();
        assert!(accepted > 0, "{t}");
    }
    let mtp = chat_piped(&["--mtp"], b"Hi.\n");
    assert_eq!(mtp.status.code(), Some(2), "{}", stderr(&mtp));
    assert!(stderr(&mtp).contains("--mtp"), "{}", stderr(&mtp));
}
