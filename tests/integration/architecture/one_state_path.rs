//! Issue 74: one prompt-state path. A sequence's KV state leaves and enters
//! the context only through src/engine/prompt_state.rs (`take`, `put`), and
//! run's `--prompt-cache-file`, chat's /save and --resume and serve's cache
//! each go through it.

use super::one_loop::{calls, calls_in, read, src_outside_ffi};

/// The path's file and the functions that move a state out of and into a sequence.
const PATH: (&str, [&str; 2]) = ("src/engine/prompt_state.rs", ["take", "put"]);

/// The context's state calls of `source` (named `file`) off the path, as
/// file:line (function).
fn stray_state_calls(file: &str, source: &str) -> Vec<String> {
    calls(source)
        .into_iter()
        .filter(|(within, callee, _, method)| {
            *method
                && matches!(callee.as_str(), "seq_state" | "set_seq_state")
                && !(file == PATH.0 && PATH.1.contains(&within.as_str()))
        })
        .map(|(within, _, line, _)| format!("{file}:{line} (in {within})"))
        .collect()
}

#[test]
fn a_sequences_state_moves_only_through_the_prompt_state_path() {
    let stray: Vec<String> = src_outside_ffi()
        .iter()
        .flat_map(|(rel, source)| stray_state_calls(rel, source))
        .collect();
    assert!(stray.is_empty(), "states moved off {PATH:?}: {stray:#?}");
    let path = read(PATH.0);
    assert!(calls_in(&path, "take", "seq_state"));
    assert!(calls_in(&path, "put", "set_seq_state"));
    assert!(calls_in(&path, "write", "take"));
    // run's file, chat's /save and --resume, serve's cache.
    assert!(calls_in(&path, "restore", "put") && calls_in(&path, "save", "write"));
    let session = read("src/engine/session.rs");
    assert!(calls_in(&session, "save_state", "write"));
    assert!(calls_in(&session, "restore_state", "read"));
    assert!(calls_in(&session, "restore_state", "put"));
    let serve = read("src/serve/prompt_cache.rs");
    assert!(calls_in(&serve, "restore", "put") && calls_in(&serve, "save", "take"));
}

#[test]
fn a_state_moved_off_the_path_is_found() {
    let planted = "impl Session { fn save_state(&mut self) { let s = self.ctx.seq_state(0); } }
        fn put(ctx: &mut Context) { ctx.set_seq_state(0, &s); seq_state(0); }";
    assert_eq!(
        stray_state_calls("src/engine/session.rs", planted),
        [
            "src/engine/session.rs:1 (in save_state)",
            "src/engine/session.rs:2 (in put)"
        ]
    );
    assert_eq!(
        stray_state_calls(PATH.0, planted),
        ["src/engine/prompt_state.rs:1 (in save_state)"]
    );
}
