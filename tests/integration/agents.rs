//! Coding agents at the door: Claude Code (`claude -p`) and Codex (`codex
//! exec`), installed from npm at pinned versions, each finish one turn against
//! `bmoe serve -v` on the agent fixture (a 65536-token context that holds
//! their prompts, every reply `Hello`), and the server answered every request
//! they made with a 2xx.
//!
//! A conversation that outgrows a small `-c` (issue 67) gets the dialect's
//! over-context 400, never a 500 or a reply cut short, and each agent does
//! what it does with it: Claude Code compacts a session and goes on (a single
//! exchange it cannot compact: it stops with `Prompt is too long`), Codex,
//! told no window for the model, stops with its own context-window error.
//!
//! Nothing leaves the machine: the server and the agent run together in a
//! fresh network namespace that has only loopback (`unshare --net`, entered
//! with `nsenter`), with every telemetry, update and error-report switch off
//! and HOME, CODEX_HOME and the XDG folders in a temporary directory. Where no
//! namespace can be made (not root, no util-linux) the tests say so and pass
//! without running the agents.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::common::{self, agent_model, npm_cli, smollm2, CLAUDE_CODE, CODEX};

/// The bound on one agent's turn (a hang is a defect, not a slow test).
const TURN_S: u64 = 120;

/// The model name the agents ask for (`--served-name`: /v1/models lists it).
const MODEL: &str = "zoo-agent";

/// A network namespace with only loopback, held by a sleeping process.
struct Netns {
    holder: Child,
}

impl Netns {
    /// A fresh namespace with loopback up, or `None` (said on stderr) where
    /// none can be made here.
    fn new() -> Option<Netns> {
        let spawned = Command::new("unshare")
            .args(["--net", "sh", "-c"])
            .arg("ip link set lo up && echo ready && exec sleep 3600")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut holder = match spawned {
            Ok(c) => c,
            Err(e) => {
                eprintln!("skipped: cannot run unshare ({e}): no loopback-only namespace");
                return None;
            }
        };
        let mut line = String::new();
        let out = holder.stdout.take().expect("holder stdout");
        let _ = BufReader::new(out).read_line(&mut line);
        if line.trim() != "ready" {
            let _ = holder.kill();
            let o = holder.wait_with_output().expect("reap unshare");
            eprintln!(
                "skipped: no loopback-only network namespace here (needs root and util-linux): {}",
                common::stderr(&o).trim()
            );
            return None;
        }
        Some(Netns { holder })
    }

    /// `program` to be run inside the namespace.
    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/proc/{}/ns/net", self.holder.id()))
            .arg("--")
            .arg(program);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// `bmoe serve -v` on the agent fixture inside `ns`, its log kept; killed
/// when dropped.
struct AgentServer {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl AgentServer {
    fn start(ns: &Netns) -> AgentServer {
        Self::with_context(ns, 65536)
    }

    /// The server with a context of `n_ctx` tokens (`-c`).
    fn with_context(ns: &Netns, n_ctx: u32) -> AgentServer {
        let m = agent_model().to_str().unwrap().to_string();
        let c = n_ctx.to_string();
        let child = ns
            .command(Path::new(env!("CARGO_BIN_EXE_bmoe")))
            .args(["serve", "-m", &m, "--port", "0", "-c", &c, "-n", "16"])
            .args(["-t", "2", "-v", "--served-name", MODEL])
            // No states of agents' long prompts written into the shared cache
            // folder (tests/prompt_cache.rs covers the prompt cache).
            .args(["--prompt-cache", "off"])
            .env("BMOE_CACHE_DIR", smollm2().parent().expect("cache dir"))
            .env_remove("RUST_LOG")
            .env_remove("BMOE_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start bmoe serve in the namespace");
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut server = AgentServer {
            child,
            port: 0,
            log: log.clone(),
        };
        let err = server.child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                    let _ = tx.send(rest.split('/').next().unwrap_or("").to_string());
                }
                log.lock().expect("log").push(line);
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("bmoe serve did not start listening"));
        server.port = port.parse().expect("port");
        server
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The log so far, after a moment for its last lines to arrive.
    fn log(&self) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(300));
        self.log.lock().expect("log").clone()
    }
}

impl Drop for AgentServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every HTTP status the server's `-v` log gives (`status=NNN`).
fn logged_statuses(log: &[String]) -> Vec<u16> {
    log.iter()
        .flat_map(|l| l.split_whitespace())
        .filter_map(|w| w.strip_prefix("status="))
        .filter_map(|s| s.trim_matches('"').parse().ok())
        .collect()
}

/// The server's `-v` log (tower-http's `finished processing request` lines)
/// shows every request of the agent answered 2xx, at least one of them with
/// a generated reply.
fn assert_all_answered(log: &[String], agent: &str) {
    let finished: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("finished processing request"))
        .collect();
    let refused: Vec<&str> = finished
        .iter()
        .filter(|l| {
            let s = logged_statuses(std::slice::from_ref(**l));
            s.is_empty() || s.iter().any(|s| !(200..300).contains(s))
        })
        .map(|l| l.as_str())
        .collect();
    let why: Vec<&str> = log
        .iter()
        .filter(|l| l.contains("refused: "))
        .map(String::as_str)
        .collect();
    assert!(
        !finished.is_empty() && refused.is_empty(),
        "the server did not answer every request of {agent} with a 2xx ({} logged):\n{}\n{}",
        finished.len(),
        refused.join("\n"),
        why.join("\n")
    );
    assert!(
        log.iter().any(|l| l.contains("request answered")),
        "the server's log shows no generated reply for {agent}"
    );
    eprintln!("{agent}: {} request(s), all answered 2xx", finished.len());
}

/// A scratch folder inside the target directory (Codex refuses to put its
/// helpers under /tmp).
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch dir")
}

/// The environment every agent gets: only these variables, HOME and the XDG
/// folders inside `home`.
fn isolated(cmd: &mut Command, home: &Path) {
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env("XDG_STATE_HOME", home.join(".local/state"))
        .env("TERM", "dumb")
        .env("NO_COLOR", "1")
        .current_dir(home)
        .stdin(Stdio::null());
}

/// Run `cmd`, killing it and failing the test after `secs`; both pipes drained.
fn output_within(cmd: &mut Command, secs: u64, what: &str) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let drain = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let t_out = drain(Box::new(child.stdout.take().expect("stdout")));
    let t_err = drain(Box::new(child.stderr.take().expect("stderr")));
    let t0 = Instant::now();
    let status = common::wait_within(&mut child, secs, what);
    debug_assert!(t0.elapsed() <= Duration::from_secs(secs + 1));
    Output {
        status,
        stdout: t_out.join().expect("stdout thread"),
        stderr: t_err.join().expect("stderr thread"),
    }
}

/// The agent's turn finished with exit 0 and a non-empty reply, the fixture's.
fn assert_turn(o: &Output, agent: &str, log: &[String]) {
    let reply = common::stdout(o);
    assert!(
        o.status.success() && reply.contains("Hello"),
        "{agent} did not finish its turn ({}):\nstdout: {reply}\nstderr: {}\nserver log (last 40 lines):\n{}",
        o.status,
        common::stderr(o),
        log[log.len().saturating_sub(40)..].join("\n")
    );
}

/// `claude -p PROMPT` inside `ns` against `server`, HOME in `home`;
/// `--continue` goes on with the folder's last session.
fn claude_command(ns: &Netns, server: &AgentServer, home: &Path, prompt: &str) -> Command {
    let (package, version, bin) = CLAUDE_CODE;
    let claude = npm_cli(package, version, bin);
    let mut cmd = ns.command(&claude);
    isolated(&mut cmd, home);
    // Print mode with nobody to ask: a tool that needs a permission is
    // refused, no MCP server is loaded, and the fixture's reply calls no tool.
    cmd.args(["-p", prompt, "--model", MODEL])
        .args([
            "--permission-mode",
            "dontAsk",
            "--permission-prompts",
            "none",
        ])
        .arg("--strict-mcp-config")
        .env("ANTHROPIC_BASE_URL", server.url())
        .env("ANTHROPIC_API_KEY", "x")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("DISABLE_BUG_COMMAND", "1")
        .env("CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY", "1")
        .env("CLAUDE_CODE_MAX_OUTPUT_TOKENS", "16");
    cmd
}

#[test]
fn claude_code_finishes_a_turn_in_print_mode() {
    let Some(ns) = Netns::new() else { return };
    let server = AgentServer::start(&ns);
    let home = scratch();
    let mut cmd = claude_command(&ns, &server, home.path(), "Say hello in one word.");
    let o = output_within(&mut cmd, TURN_S, "claude -p");
    let log = server.log();
    assert_turn(&o, "claude -p", &log);
    assert_all_answered(&log, "claude -p");
}

/// Codex's config: the bmoe provider (the Responses API), no update check,
/// no analytics, feedback or OpenTelemetry export (codex_config.toml, which
/// benches/agent_replay/record.py writes too).
fn codex_config(url: &str) -> String {
    include_str!("codex_config.toml")
        .replace("{MODEL}", MODEL)
        .replace("{URL}", url)
}

/// `codex exec ARGS` inside `ns` against `server`, HOME in `home` and
/// CODEX_HOME in `home/.codex` (its config.toml `codex_config`, then `extra`).
fn codex_command(
    ns: &Netns,
    server: &AgentServer,
    home: &Path,
    extra: &str,
    args: &[&str],
) -> Command {
    let (package, version, bin) = CODEX;
    let codex = npm_cli(package, version, bin);
    let codex_home: PathBuf = home.join(".codex");
    std::fs::create_dir_all(&codex_home).expect("CODEX_HOME");
    let config = format!("{extra}\n{}", codex_config(&server.url()));
    std::fs::write(codex_home.join("config.toml"), config).expect("codex config");
    let mut cmd = ns.command(&codex);
    isolated(&mut cmd, home);
    cmd.arg("exec")
        .args(["--skip-git-repo-check", "--color", "never"])
        .args(args)
        .env("CODEX_HOME", &codex_home);
    cmd
}

#[test]
fn codex_finishes_a_turn_in_exec_mode() {
    let Some(ns) = Netns::new() else { return };
    let server = AgentServer::start(&ns);
    let home = scratch();
    let args = ["--sandbox", "read-only", "Say hello in one word."];
    let mut cmd = codex_command(&ns, &server, home.path(), "", &args);
    let o = output_within(&mut cmd, TURN_S, "codex exec");
    let log = server.log();
    assert_turn(&o, "codex exec", &log);
    assert_all_answered(&log, "codex exec");
}

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
