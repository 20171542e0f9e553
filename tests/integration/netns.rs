//! A shaped link for the `--rpc` tests: a network namespace of the test's
//! own, joined to this one by a veth pair with a private /30, both ends held
//! to a rate by a token-bucket qdisc (`tc ... tbf`; this kernel has no netem,
//! so no added delay), and a `bmoe rpc-server` inside it. Everything the
//! test made is removed when the [`ShapedLink`] is dropped.

use std::fs::File;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A namespace and its veth pair, shaped to one rate.
pub struct ShapedLink {
    ns: String,
    host_if: String,
    /// This side's address and the namespace's.
    pub here: String,
    pub there: String,
}

/// `cmd args`, Ok or the reason it failed (its stderr).
fn sh(cmd: &str, args: &[&str]) -> Result<(), String> {
    let o = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if o.status.success() {
        return Ok(());
    }
    Err(format!(
        "`{cmd} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr).trim()
    ))
}

/// Why this host cannot make a namespace link (None: it can try).
fn cannot() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    for (tool, arg) in [("ip", "-V"), ("tc", "-V")] {
        if sh(tool, &[arg]).is_err() {
            return Some(format!("no `{tool}` (install iproute2)"));
        }
    }
    None
}

/// A /30 in 10.231.0.0/16 that no interface here uses yet: (here, there).
fn free_subnet(seed: u32) -> (String, String) {
    let used = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    (0..16384u32)
        .map(|i| (seed + i) % 16384)
        .map(|b| {
            let (x, y) = (b / 64, (b % 64) * 4);
            (
                format!("10.231.{x}.{}", y + 1),
                format!("10.231.{x}.{}", y + 2),
            )
        })
        .find(|(a, b)| !used.contains(&format!(" {a}/")) && !used.contains(&format!(" {b}/")))
        .expect("a free /30 in 10.231.0.0/16")
}

impl ShapedLink {
    /// A link held to `rate` (tc's syntax: `1gbit`, `100mbit`), or None
    /// with the reason printed where this host cannot make one.
    pub fn make(rate: &str) -> Option<Self> {
        static N: AtomicU32 = AtomicU32::new(0);
        if let Some(why) = cannot() {
            eprintln!("skipped: no shaped link here: {why}");
            return None;
        }
        let (pid, n) = (std::process::id(), N.fetch_add(1, Ordering::SeqCst));
        let (here, there) = free_subnet(pid.wrapping_mul(8).wrapping_add(n));
        let link = Self {
            ns: format!("bmoe-link-{pid}-{n}"),
            host_if: format!("bl{pid}x{n}h"),
            here,
            there,
        };
        match link.build(rate) {
            Ok(()) => Some(link),
            Err(why) => {
                eprintln!("skipped: no shaped link here: {why}");
                None
            }
        }
    }

    fn build(&self, rate: &str) -> Result<(), String> {
        let (ns, h) = (self.ns.as_str(), self.host_if.as_str());
        let peer = format!("{}n", h.trim_end_matches('h'));
        let shape = [
            "root", "tbf", "rate", rate, "burst", "128kb", "latency", "50ms",
        ];
        sh("ip", &["netns", "add", ns])?;
        sh(
            "ip",
            &["link", "add", h, "type", "veth", "peer", "name", &peer],
        )?;
        sh("ip", &["link", "set", &peer, "netns", ns])?;
        sh(
            "ip",
            &["addr", "add", &format!("{}/30", self.here), "dev", h],
        )?;
        sh("ip", &["link", "set", h, "up"])?;
        let cidr = format!("{}/30", self.there);
        sh("ip", &["-n", ns, "addr", "add", &cidr, "dev", &peer])?;
        sh("ip", &["-n", ns, "link", "set", &peer, "up"])?;
        sh("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        let mut q = vec!["qdisc", "add", "dev", h];
        q.extend_from_slice(&shape);
        sh("tc", &q)?;
        let mut q = vec!["netns", "exec", ns, "tc", "qdisc", "add", "dev", &peer];
        q.extend_from_slice(&shape);
        sh("ip", &q)
    }

    /// Bytes this side's qdisc has sent (`tc -s qdisc`): what crossed the
    /// shaped link towards the namespace.
    pub fn sent_bytes(&self) -> u64 {
        let o = Command::new("tc")
            .args(["-s", "qdisc", "show", "dev", &self.host_if])
            .output()
            .expect("tc -s qdisc");
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let after = text.split_once("Sent ").map_or("", |(_, r)| r);
        after
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no Sent count in {text}"))
    }

    /// `bmoe rpc-server` inside the namespace on its address, with `extra`
    /// flags; listening when this returns.
    pub fn serve(&self, extra: &[&str]) -> NsServer {
        let log = std::env::temp_dir().join(format!("{}.log", self.ns));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, env!("CARGO_BIN_EXE_bmoe")])
            .args([
                "rpc-server",
                "--host",
                &self.there,
                "--allow-remote",
                "-t",
                "1",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("server log"));
        let child = cmd.spawn().expect("start rpc-server in the namespace");
        let addr = format!("{}:50052", self.there);
        let server = NsServer { child, addr, log };
        let t0 = Instant::now();
        while TcpStream::connect(&server.addr).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "rpc-server did not listen in the namespace: {}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }
}

impl Drop for ShapedLink {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the pair, and with it
        // this one; the second delete is for a build that stopped halfway.
        let _ = sh("ip", &["netns", "del", &self.ns]);
        let _ = sh("ip", &["link", "del", &self.host_if]);
    }
}

/// The rpc-server in a namespace; killed when dropped (before its link).
pub struct NsServer {
    child: Child,
    pub addr: String,
    log: PathBuf,
}

impl NsServer {
    /// What it wrote on stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
