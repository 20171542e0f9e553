//! `bmoe rpc-server` on its own: its tensor cache checked at start, a silent client dropped, port 0, a bad cache folder; the `--rpc` flags refused without `--rpc`.

use crate::common::{bmoe_within, e8k2, stderr, stdout};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::rpc::*;

/// The cache files of `dir` (ggml's names), largest first.
fn cache_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("cache dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.file_name().unwrap().len() == 16)
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(std::fs::metadata(p).unwrap().len()));
    v
}

#[test]
fn damaged_cache_files_are_removed_at_start_and_the_text_stays_the_resident_one() {
    let m = e8k2().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let resident = run_text(m, 8, &["--resident"]);
    assert!(resident.status.success(), "{}", stderr(&resident));
    let rpc = |s: &Server| {
        let o = run_text(
            m,
            8,
            &["--rpc", &s.addr, "--rpc-layers", "15", "--cache-mb", "0"],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout(&o), stdout(&resident), "{}", stderr(&o));
    };
    // The first load fills the cache.
    let server = Server::start_with(&["--cache", d]);
    rpc(&server);
    drop(server);
    let files = cache_files(dir.path());
    assert!(!files.is_empty(), "nothing cached in {d}");
    let big = &files[0];
    let name = big.file_name().unwrap().to_str().unwrap();
    let len = std::fs::metadata(big).unwrap().len();
    // A file cut short (a server killed mid-write, a full disk), then one
    // overwritten with plausible floats.
    let cut_short = |p: &std::path::Path| {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.set_len(1_000_000).unwrap();
    };
    let scribbled = |p: &std::path::Path| {
        let floats: Vec<u8> = (0..len / 4)
            .flat_map(|i| (0.01f32 * (i % 97) as f32).to_le_bytes())
            .collect();
        std::fs::write(p, floats).unwrap();
    };
    for damage in [&cut_short as &dyn Fn(&std::path::Path), &scribbled] {
        damage(big);
        let server = Server::start_with(&["--cache", d]);
        let (found, err) = server.stderr_until("1 damaged removed", 30);
        assert!(found, "{err}");
        let said = format!("removed the damaged cache file {d}/{name}: its bytes hash to");
        assert!(err.contains(&said), "{err}");
        assert!(!big.exists(), "{big:?} kept");
        // The load sends that tensor again (and caches it): the resident text.
        rpc(&server);
        drop(server);
        assert_eq!(std::fs::metadata(big).map(|m| m.len()).ok(), Some(len));
    }
}

#[test]
fn a_silent_client_is_dropped_after_the_first_byte_timeout_and_the_next_is_served() {
    let server = Server::start_with(&["--first-byte-timeout", "1"]);
    let mut silent = TcpStream::connect(&server.addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 1];
    // Closed by the server (EOF or a reset), not a read timeout.
    match std::io::Read::read(&mut silent, &mut buf) {
        Ok(n) => assert_eq!(n, 0),
        Err(e) => assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "still held after {:?}: {e}",
            t0.elapsed()
        ),
    }
    let (found, err) = server.stderr_until("sent nothing within 1 s", 30);
    assert!(found, "{err}");
    let m = e8k2().to_str().unwrap();
    let o = run_text(m, 2, &["--rpc", &server.addr, "--rpc-layers", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn rpc_server_on_port_0_prints_the_port_it_took_at_once_through_a_pipe() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["rpc-server", "--port", "0", "-t", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rpc-server");
    let lines = line_channel(child.stdout.take().unwrap());
    let t0 = Instant::now();
    let mut endpoint = None;
    while endpoint.is_none() && t0.elapsed() < Duration::from_secs(30) {
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(200)) {
            endpoint = l
                .split_once("endpoint")
                .and_then(|(_, r)| r.split_once(':'))
                .map(|(_, a)| a.trim().to_string());
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    // No client connected: the banner came out before one.
    let endpoint = endpoint.expect("no endpoint line within 30 s");
    let port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    assert_ne!(port, 0, "{endpoint}");
}

#[test]
fn a_cache_that_is_not_a_writable_folder_is_refused() {
    let file = tempfile::NamedTempFile::new().unwrap();
    for dir in ["/proc/1", file.path().to_str().unwrap()] {
        let o = bmoe_within(&["rpc-server", "--port", "0", "--cache", dir], 30);
        assert_eq!(o.status.code(), Some(2), "{dir}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("--cache {dir}: ")),
            "{}",
            stderr(&o)
        );
    }
    let o = bmoe_within(&["rpc-server", "--port", "0", "--cache", "/proc/1"], 30);
    assert!(stderr(&o).contains("not writable"), "{}", stderr(&o));
}

#[test]
fn rpc_flags_without_rpc_and_duplicate_hosts_are_refused_and_inspect_takes_auto() {
    let m = e8k2().to_str().unwrap();
    let run = ["run", "-m", m, "-p", "Hi", "-n", "2"];
    for extra in [["--rpc-layers", "3"], ["--rpc-timeout", "5"]] {
        let args: Vec<&str> = run.iter().chain(&extra).copied().collect();
        let o = bmoe_within(&args, 60);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("--rpc <HOST:PORT"), "{}", stderr(&o));
    }
    let args: Vec<&str> = run.iter().chain(&["--rpc", "a:1,a:1"]).copied().collect();
    let o = bmoe_within(&args, 60);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("duplicate host a:1"), "{}", stderr(&o));
    let o = bmoe_within(&["inspect", m, "--rpc-layers", "auto"], 60);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("--rpc-layers auto") && stdout(&o).contains("all 30 layers"),
        "{}",
        stdout(&o)
    );
}
