//! Coding agents past the context: Claude Code and Codex stop or compact when a prompt or a session outgrows the served context.

use super::common::{self};

use super::agents::*;

/// Words `w0 w1 ...`: a prompt of about four tokens a word on the fixture.
fn words(n: usize) -> String {
    (0..n).map(|i| format!("w{i} ")).collect()
}

/// `n` sentences of English, about ten tokens each: text whose size the
/// agents estimate about right (four characters a token), unlike `words`.
fn sentences(n: usize) -> String {
    "The quick brown fox jumps over the lazy dog. ".repeat(n)
}

/// The server's `-v` log shows at least one request refused with the
/// over-context 400 (`prompt is too long: N tokens > M maximum`), and no
/// request answered 5xx or failed after its status: never a 500, never a
/// reply cut short. Returns each refusal's `(N, M)`.
fn assert_refused_over_context(log: &[String], agent: &str) -> Vec<(u64, u64)> {
    let tail = || log[log.len().saturating_sub(40)..].join("\n");
    let refusals: Vec<(u64, u64)> = log
        .iter()
        .filter_map(|l| l.split("refused: prompt is too long: ").nth(1))
        .filter_map(|rest| {
            let mut w = rest.split_whitespace();
            let n = w.next()?.parse().ok()?;
            let m = w.nth(2)?.parse().ok()?;
            Some((n, m))
        })
        .collect();
    let statuses = logged_statuses(log);
    assert!(
        !refusals.is_empty() && statuses.contains(&400),
        "{agent}: the server logged no over-context 400:\n{}",
        tail()
    );
    assert!(
        statuses.iter().all(|s| *s < 500),
        "{agent}: the server answered a 5xx ({statuses:?}):\n{}",
        tail()
    );
    let failed: Vec<&String> = log
        .iter()
        .filter(|l| l.contains(" ERROR ") || l.contains("generation failed"))
        .collect();
    assert!(
        failed.is_empty(),
        "{agent}: a generation failed: {failed:?}"
    );
    eprintln!(
        "{agent}: {} request(s), {} refused as over the context {refusals:?}",
        statuses.len(),
        refusals.len()
    );
    refusals
}

/// One turn of Claude Code whose prompt alone outgrows `-c`: Claude Code
/// cannot compact a single exchange, so it stops (exit 1) with its
/// `Prompt is too long` line naming the server's figures.
#[test]
fn claude_code_stops_on_a_prompt_past_the_context() {
    let Some(ns) = Netns::new() else { return };
    let server = AgentServer::with_context(&ns, 16384);
    let home = scratch();
    let prompt = format!("{} Say hello.", words(2000));
    let mut cmd = claude_command(&ns, &server, home.path(), &prompt);
    let o = output_within(&mut cmd, TURN_S, "claude -p");
    let log = server.log();
    let said = format!("{}{}", common::stdout(&o), common::stderr(&o));
    let refusals = assert_refused_over_context(&log, "claude -p");
    let (n, m) = refusals[refusals.len() - 1];
    assert!(
        !o.status.success()
            && said.contains("Prompt is too long")
            && said.contains(&format!("~{n} tokens (limit {m})")),
        "claude -p did not stop with the over-context message ({}):\n{said}",
        o.status
    );
}

/// A Claude Code session (`claude -p --continue`) that outgrows `-c`: on the
/// 400 Claude Code compacts the conversation (a summary request) and sends
/// the turn again, which fits; every turn finishes with the fixture's reply.
#[test]
fn claude_code_compacts_a_session_that_outgrows_the_context() {
    let Some(ns) = Netns::new() else { return };
    // Claude Code's own prompt is about 12k tokens on the fixture; each turn
    // adds about 6k: the first fits, the second does not.
    let server = AgentServer::with_context(&ns, 20480);
    let home = scratch();
    for turn in 1..=2 {
        let prompt = format!("Turn {turn}. {} Say hello.", words(1500));
        let mut cmd = claude_command(&ns, &server, home.path(), &prompt);
        if turn > 1 {
            cmd.arg("--continue");
        }
        let o = output_within(&mut cmd, TURN_S, "claude -p --continue");
        assert_turn(&o, "claude -p --continue", &server.log());
    }
    let log = server.log();
    assert_refused_over_context(&log, "claude -p --continue");
    let last = log
        .iter()
        .rposition(|l| l.contains("refused: prompt is too long"))
        .expect("a refusal");
    assert!(
        log[last..].iter().any(|l| l.contains("request answered")),
        "claude -p --continue sent nothing that fit after the 400"
    );
}

/// A Codex session (`codex exec`, then `codex exec resume --last`) that
/// outgrows `-c`: Codex knows no window for the model (it falls back to a
/// large one), so it does not compact first; on the 400's
/// `context_length_exceeded` it stops (exit 1) with its own line for it.
#[test]
fn codex_stops_when_a_session_outgrows_the_context() {
    let Some(ns) = Netns::new() else { return };
    // Codex's own prompt is about 6.4k tokens on the fixture; each turn adds
    // about 1.5k: turns 1 to 3 fit, 4 does not.
    let server = AgentServer::with_context(&ns, 12288);
    let home = scratch();
    let mut stopped = None;
    for turn in 1..=5 {
        let prompt = format!("Turn {turn}. {} Say hello.", words(400));
        let args: &[&str] = if turn == 1 {
            &["--sandbox", "read-only", prompt.as_str()]
        } else {
            &["resume", "--last", prompt.as_str()]
        };
        let mut cmd = codex_command(&ns, &server, home.path(), "", args);
        let o = output_within(&mut cmd, TURN_S, "codex exec");
        if !o.status.success() {
            stopped = Some((turn, o));
            break;
        }
        assert_turn(&o, "codex exec", &server.log());
    }
    let log = server.log();
    let (turn, o) = stopped.expect("codex's session never outgrew the context");
    assert!(turn > 1, "the first turn already outgrew the context");
    let said = common::stderr(&o);
    assert!(
        said.contains("Codex ran out of room in the model's context window"),
        "codex exec did not stop with its context-window message:\n{said}"
    );
    assert_refused_over_context(&log, "codex exec");
}

/// Claude Code told the server's window (`CLAUDE_CODE_MAX_CONTEXT_TOKENS`,
/// its window for a model it does not know) compacts before the window is
/// full: a session whose turns together hold far more than `-c` goes on,
/// every request it makes answered 2xx (no 400 to recover from), with the
/// summary requests of its compactions between the turns.
#[test]
fn claude_code_told_the_window_compacts_before_it() {
    let Some(ns) = Netns::new() else { return };
    // Claude Code's own prompt is about 13k tokens here (12k, and the git
    // status of the folder the test runs in); each turn adds about 3.5k. From
    // the second turn on it compacts first: the summary request (the history
    // so far and its instructions) and the turn after it both fit.
    let server = AgentServer::with_context(&ns, 20480);
    let home = scratch();
    let turns = 3;
    for turn in 1..=turns {
        let prompt = format!("Turn {turn}. {} Say hello.", sentences(350));
        let mut cmd = claude_command(&ns, &server, home.path(), &prompt);
        cmd.env("CLAUDE_CODE_MAX_CONTEXT_TOKENS", "20480");
        if turn > 1 {
            cmd.arg("--continue");
        }
        let o = output_within(&mut cmd, TURN_S, "claude -p --continue");
        assert_turn(&o, "claude -p --continue", &server.log());
        assert!(
            !common::stderr(&o).contains("doesn't recognize the model"),
            "told the window, Claude Code still warned of an unknown model's:\n{}",
            common::stderr(&o)
        );
    }
    let log = server.log();
    assert_all_answered(&log, "claude -p --continue");
    let answered = log
        .iter()
        .filter(|l| l.contains("request answered"))
        .count();
    assert!(
        answered > turns,
        "Claude Code made {answered} request(s) for {turns} turns: it did not compact"
    );
}
