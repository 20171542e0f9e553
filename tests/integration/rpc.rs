//! `--rpc`: the model's last layers on a `bmoe rpc-server` on loopback, the
//! local ones streamed; a server that dies or stalls mid-decode; the
//! refusals (docs/scale-out.md).

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{bmoe, bmoe_within, e8k2, stderr, stdout, zoo_model, PROSE};

/// A `bmoe rpc-server` on a free loopback port, killed when dropped.
pub(crate) struct Server {
    child: Child,
    pub(crate) addr: String,
    /// Its stdout: one line per client connection accepted or closed.
    lines: std::sync::mpsc::Receiver<String>,
    /// Its stderr, line by line.
    errs: std::sync::mpsc::Receiver<String>,
}

/// Each line `r` reads, sent to the receiver returned.
pub(crate) fn line_channel(
    r: impl std::io::Read + Send + 'static,
) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    rx
}

impl Server {
    pub(crate) fn start() -> Self {
        Self::start_with(&[])
    }

    /// With `extra` rpc-server flags.
    pub(crate) fn start_with(extra: &[&str]) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        Self::start_at(port, extra)
    }

    /// On `port`, with `extra` rpc-server flags.
    pub(crate) fn start_at(port: u16, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
            .args(["rpc-server", "--port", &port.to_string(), "-t", "1"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rpc-server");
        let lines = line_channel(child.stdout.take().expect("stdout"));
        let errs = line_channel(child.stderr.take().expect("stderr"));
        let addr = format!("127.0.0.1:{port}");
        let t0 = Instant::now();
        while TcpStream::connect(&addr).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "rpc-server did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            addr,
            lines,
            errs,
        }
    }

    /// Its stderr lines until one contains `want` (None when none did
    /// within `secs`), all of them.
    pub(crate) fn stderr_until(&self, want: &str, secs: u64) -> (bool, String) {
        let t0 = Instant::now();
        let mut all = String::new();
        while t0.elapsed() < Duration::from_secs(secs) {
            if let Ok(l) = self.errs.recv_timeout(Duration::from_millis(200)) {
                all.push_str(&l);
                all.push('\n');
                if l.contains(want) {
                    return (true, all);
                }
            }
        }
        (false, all)
    }

    /// Wait for the run's own connection: bmoe's greeting comes first (one
    /// connection, closed at once), ggml's client second.
    pub(crate) fn wait_for_client(&self) {
        let t0 = Instant::now();
        let mut accepted = 0;
        while t0.elapsed() < Duration::from_secs(60) {
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
                accepted += usize::from(l.starts_with("Accepted client connection"));
                if accepted == 2 {
                    return;
                }
            }
        }
        panic!("the run's client did not reach the rpc-server");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn run_text(model: &str, n: u32, extra: &[&str]) -> std::process::Output {
    let n = n.to_string();
    let mut args = vec!["run", "-m", model, "-p", PROSE, "-n", &n];
    args.extend_from_slice(extra);
    bmoe_within(&args, 300)
}

/// The model's text resident in one process, then split with `layers` on the
/// server and the rest streamed at cache 0, with --overlap and at 25%.
pub(crate) fn split_equals_resident(model: &str, layers: &str) {
    let server = Server::start();
    let resident = run_text(model, 16, &["--resident"]);
    assert!(resident.status.success(), "{}", stderr(&resident));
    let want = stdout(&resident);
    assert!(!want.trim().is_empty());
    let rpc = ["--rpc", server.addr.as_str(), "--rpc-layers", layers];
    let trace = std::env::temp_dir().join(format!("bmoe-rpc-{}.json", std::process::id()));
    let traced = ["--trace-chrome", trace.to_str().unwrap()];
    for extra in [
        &["--cache-mb", "0", traced[0], traced[1]][..],
        &["--cache-mb", "0", "--overlap"],
        &["--cache-mb", "25%"],
    ] {
        let args: Vec<&str> = rpc.iter().chain(extra).copied().collect();
        let o = run_text(model, 16, &args);
        let err = stderr(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        assert_eq!(
            stdout(&o),
            want,
            "{model} {args:?}: the split text differs\n{err}"
        );
        assert!(err.contains("note: rpc: layers"), "{err}");
        // The split streamed (bytes read here) and used the network.
        let rpc_line = err
            .lines()
            .find(|l| l.starts_with("rpc: "))
            .expect("rpc line");
        assert!(!rpc_line.contains("network 0.0 KiB"), "{rpc_line}");
        assert!(err.contains("moe-stream: "), "{err}");
    }
    // The trace shows the remote part of each decode with its bytes.
    let t = std::fs::read_to_string(&trace).expect("trace");
    assert!(
        t.contains("rpc.remote") && t.contains("net_bytes"),
        "no rpc.remote span"
    );
    let _ = std::fs::remove_file(&trace);
}

#[test]
fn e8k2_split_across_two_processes_writes_the_resident_text() {
    split_equals_resident(e8k2().to_str().unwrap(), "15");
}

#[test]
fn a_zoo_model_split_across_two_processes_writes_the_resident_text() {
    split_equals_resident(&zoo_model("qwen3moe", "q8_0"), "1");
}

#[test]
fn two_hosts_share_the_remote_layers_and_the_text_stays_the_resident_one() {
    let (a, b) = (Server::start(), Server::start());
    let m = e8k2().to_str().unwrap();
    let resident = run_text(m, 12, &["--resident"]);
    assert!(resident.status.success(), "{}", stderr(&resident));
    let hosts = format!("{},{}", a.addr, b.addr);
    let o = run_text(
        m,
        12,
        &["--rpc", &hosts, "--rpc-layers", "20", "--cache-mb", "0"],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(stdout(&o), stdout(&resident), "{err}");
    assert!(err.contains(&format!("on {hosts} (")), "{err}");
    // The default, auto: what the host reports free holds; on this host the
    // whole model, so nothing streams here and it runs resident.
    let o = run_text(m, 12, &["--rpc", &a.addr]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(stdout(&o), stdout(&resident), "{err}");
    let all = err.contains("every layer is on the RPC hosts");
    assert!(all || err.contains("note: rpc: layers"), "{err}");
}

/// Start a long run against `server`, wait until it decodes, then `act` on
/// the server; the run must end with exit 5 and `why` within `secs`.
pub(crate) fn lose_the_server_mid_decode(act: libc::c_int, extra: &[&str], why: &str, secs: u64) {
    let server = Server::start();
    let csv = std::env::temp_dir().join(format!("bmoe-rpc-lost-{}-{act}.csv", std::process::id()));
    let mut args = vec![
        "run".to_string(),
        "-m".into(),
        e8k2().to_str().unwrap().into(),
        "-p".into(),
        PROSE.into(),
        "-n".into(),
        "100000".into(),
        "--ignore-eos".into(),
        "--rpc".into(),
        server.addr.clone(),
        "--rpc-layers".into(),
        "15".into(),
        "--csv".into(),
        csv.to_str().unwrap().into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start run");
    server.wait_for_client();
    // Let it load and decode for a while.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended before the server was lost"
    );
    // SAFETY: sends a signal to the server child, which is alive (owned by `server`).
    unsafe { libc::kill(server.child.id() as libc::pid_t, act) };
    let t0 = Instant::now();
    let status =
        crate::common::wait_within(&mut child, secs + 20, "the run after its server was lost");
    let took = t0.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(5), "{err}");
    assert!(took < Duration::from_secs(secs), "exit after {took:?}");
    assert!(
        err.contains("an RPC host was lost") && err.contains(why),
        "{err}"
    );
    // The rows written so far are kept.
    let kept = std::fs::read_to_string(&csv).expect("the CSV is kept");
    assert!(kept.lines().count() > 5, "{kept}");
    let _ = std::fs::remove_file(&csv);
    if act == libc::SIGSTOP {
        // SAFETY: as above; let the drop's kill end it.
        unsafe { libc::kill(server.child.id() as libc::pid_t, libc::SIGCONT) };
    }
}

#[test]
fn a_server_killed_mid_decode_ends_the_run_with_exit_5_within_10_s() {
    lose_the_server_mid_decode(libc::SIGKILL, &[], "crashed", 10);
}

#[test]
fn a_stalled_server_ends_the_run_after_the_rpc_timeout() {
    lose_the_server_mid_decode(
        libc::SIGSTOP,
        &["--rpc-timeout", "2"],
        "no byte from or to",
        10,
    );
}

#[test]
fn the_server_stays_on_loopback_unless_asked_and_bad_splits_are_refused() {
    let o = bmoe(&["rpc-server", "--host", "0.0.0.0", "--port", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--allow-remote"), "{}", stderr(&o));
    // A host that is down: refused with its address before the load.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let m = e8k2().to_str().unwrap();
    let o = bmoe(&["run", "-m", m, "-p", "Hi", "-n", "2", "--rpc", &closed]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("cannot reach the RPC host {closed}")),
        "{}",
        stderr(&o)
    );
    let o = bmoe(&["run", "-m", m, "-p", "Hi", "-n", "2", "--rpc", "nohost"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // More layers than the model has.
    let server = Server::start();
    let o = bmoe(&[
        "run",
        "-m",
        m,
        "-p",
        "Hi",
        "-n",
        "2",
        "--rpc",
        &server.addr,
        "--rpc-layers",
        "31",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("choose 0..=30"), "{}", stderr(&o));
}

/// A server of another protocol version: it answers the client's HELLO
/// (command 14) with version 8.0.0, as a newer ggml-rpc would.
pub(crate) fn fake_newer_server() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut c in l.incoming().map_while(Result::ok) {
            let mut head = [0u8; 9];
            if c.read_exact(&mut head).is_err() {
                continue; // bmoe's own reachability check: connect, close
            }
            let size = u64::from_le_bytes(head[1..9].try_into().unwrap());
            let mut req = vec![0u8; size as usize];
            let _ = c.read_exact(&mut req);
            // | size (8 bytes) | major minor patch padding | 24 bytes of caps |
            let mut rsp = 28u64.to_le_bytes().to_vec();
            rsp.extend_from_slice(&[8, 0, 0, 0]);
            rsp.extend_from_slice(&[0u8; 24]);
            let _ = c.write_all(&rsp);
        }
    });
    addr
}

#[test]
fn a_server_of_another_protocol_version_is_refused_clearly() {
    let addr = fake_newer_server();
    let m = e8k2().to_str().unwrap();
    let o = bmoe_within(&["run", "-m", m, "-p", "Hi", "-n", "2", "--rpc", &addr], 60);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(5), "{err}");
    // bmoe's own greeting finds it, before ggml's client would abort.
    let want = format!("the RPC host {addr} speaks protocol 8.0.0, this bmoe 7.0.0");
    assert!(err.contains(&want), "{err}");
}

/// `--route-trace` with every layer on the hosts would record nothing (it
/// once exited 0 and wrote no file, without a word): refused before the
/// hosts are reached (the port here is closed), no file written.
#[test]
fn a_route_trace_with_every_layer_remote_is_refused_up_front() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.bmrt");
    let m = e8k2().to_str().unwrap();
    let args = [
        "run",
        "-m",
        m,
        "-p",
        "Hi",
        "-n",
        "2",
        "--rpc",
        &closed,
        "--rpc-layers",
        "30",
        "--route-trace",
        trace.to_str().unwrap(),
    ];
    let o = bmoe_within(&args, 60);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("nothing to record") && stderr(&o).contains("at most 29"),
        "{}",
        stderr(&o)
    );
    assert!(!trace.exists());
    // One layer kept here: the pairing is fine, and the closed host is what
    // ends the run (exit 5).
    let mut args = args;
    args[10] = "29";
    let o = bmoe_within(&args, 60);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
}
