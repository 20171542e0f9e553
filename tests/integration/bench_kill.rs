//! `bmoe bench` killed outright takes its running child with it.

use crate::common::*;

/// Pids of the processes whose parent is `parent` and whose command line
/// holds `word`.
fn children_running(parent: u32, word: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // The fields after the command's closing parenthesis: state, ppid, ...
        let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
        let ppid = after.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if ppid == Some(parent) && cmd.contains(word) {
            out.push(pid);
        }
    }
    out
}

/// Whether `pid` is gone (or a zombie nobody reaped: it runs no more).
fn gone(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, a)| a.split_whitespace().next());
    matches!(state, None | Some("Z") | Some("X"))
}

#[test]
fn a_bench_killed_outright_takes_its_running_child_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let cells = dir.path().join("cells.txt");
    std::fs::write(&cells, "c0: --cache-mb 0\n").unwrap();
    let out = dir.path().join("out");
    let mut bench = std::process::Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["bench", "-m", e8k2().to_str().unwrap(), "--cells"])
        .arg(&cells)
        .arg("-o")
        .arg(&out)
        .args(["-n", "400", "--probe-seconds", "0.2", "--probe-depths", "1"])
        .env("BMOE_CACHE_DIR", smollm2().parent().unwrap())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let child = loop {
        // A cell's run (cache 0, 400 tokens: minutes), not the probe's quick resident one.
        if let Some(&pid) = children_running(bench.id(), "--cache-mb 0").first() {
            break pid;
        }
        if t0.elapsed() > std::time::Duration::from_secs(120) || bench.try_wait().unwrap().is_some()
        {
            let _ = bench.kill();
            panic!("no bmoe run child seen");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    bench.kill().unwrap(); // SIGKILL: the bench cannot clean up.
    bench.wait().unwrap();
    let t1 = std::time::Instant::now();
    while !gone(child) {
        assert!(
            t1.elapsed() < std::time::Duration::from_secs(10),
            "bmoe run {child} outlived its killed bench"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
