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
pub(crate) const TURN_S: u64 = 120;

/// The model name the agents ask for (`--served-name`: /v1/models lists it).
pub(crate) const MODEL: &str = "zoo-agent";

/// A network namespace with only loopback, held by a sleeping process.
pub(crate) struct Netns {
    holder: Child,
}

impl Netns {
    /// A fresh namespace with loopback up, or `None` (said on stderr) where
    /// none can be made here.
    pub(crate) fn new() -> Option<Netns> {
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
    pub(crate) fn command(&self, program: &Path) -> Command {
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
pub(crate) struct AgentServer {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl AgentServer {
    pub(crate) fn start(ns: &Netns) -> AgentServer {
        Self::with_context(ns, 65536)
    }

    /// The server with a context of `n_ctx` tokens (`-c`).
    pub(crate) fn with_context(ns: &Netns, n_ctx: u32) -> AgentServer {
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

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The log so far, after a moment for its last lines to arrive.
    pub(crate) fn log(&self) -> Vec<String> {
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
pub(crate) fn logged_statuses(log: &[String]) -> Vec<u16> {
    log.iter()
        .flat_map(|l| l.split_whitespace())
        .filter_map(|w| w.strip_prefix("status="))
        .filter_map(|s| s.trim_matches('"').parse().ok())
        .collect()
}

/// The server's `-v` log (tower-http's `finished processing request` lines)
/// shows every request of the agent answered 2xx, at least one of them with
/// a generated reply.
pub(crate) fn assert_all_answered(log: &[String], agent: &str) {
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
pub(crate) fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch dir")
}

/// The environment every agent gets: only these variables, HOME and the XDG
/// folders inside `home`.
pub(crate) fn isolated(cmd: &mut Command, home: &Path) {
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
pub(crate) fn output_within(cmd: &mut Command, secs: u64, what: &str) -> Output {
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
pub(crate) fn assert_turn(o: &Output, agent: &str, log: &[String]) {
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
pub(crate) fn claude_command(
    ns: &Netns,
    server: &AgentServer,
    home: &Path,
    prompt: &str,
) -> Command {
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
pub(crate) fn codex_config(url: &str) -> String {
    include_str!("codex_config.toml")
        .replace("{MODEL}", MODEL)
        .replace("{URL}", url)
}

/// `codex exec ARGS` inside `ns` against `server`, HOME in `home` and
/// CODEX_HOME in `home/.codex` (its config.toml `codex_config`, then `extra`).
pub(crate) fn codex_command(
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
