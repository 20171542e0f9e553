//! `rpc-server`'s deadline on a client's first bytes.
//!
//! ggml's server accepts one client at a time and serves it until it closes
//! the connection, waiting on its socket without a timeout
//! (`ggml_backend_rpc_start_server`: accept, `rpc_serve_client`, next). A
//! connection that never sends a byte (a port scanner, `nc`, a stuck client)
//! would hold the server forever, every real client refused as busy. ggml
//! owns the socket, so bmoe watches it from beside: every accepted connection
//! of the server's port (found through `/proc/self/fd`) that has received no
//! byte (`TCP_INFO`) within the deadline is shut down; ggml's read then ends,
//! it closes the connection and accepts the next. A client that has sent
//! anything is never touched: a quiet chat between turns stays connected.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::net;

/// How often the accepted connections are looked at.
const POLL: Duration = Duration::from_millis(200);

/// `--first-byte-timeout`'s default.
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);

/// One connection the server accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Accepted {
    fd: RawFd,
    /// The socket's inode: names the connection across fd reuse.
    inode: u64,
    peer: std::net::SocketAddr,
}

/// The socket inode an fd link names (`socket:[N]`).
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// The inode of the socket `fd` is now (None when it is not one).
fn inode_of(fd: RawFd) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    socket_inode(&link.to_string_lossy())
}

/// This process's connected TCP sockets on local `port`: the server's
/// accepted clients (its listening socket has no peer).
fn accepted(port: u16) -> Vec<Accepted> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let fd: RawFd = e.file_name().to_str()?.parse().ok()?;
            let inode = socket_inode(&std::fs::read_link(e.path()).ok()?.to_string_lossy())?;
            (net::local_of(fd)?.port() == port).then_some(())?;
            let peer = net::peer_of(fd)?;
            Some(Accepted { fd, inode, peer })
        })
        .collect()
}

/// When each connection was first seen, and whether it was dropped.
#[derive(Debug, Default)]
struct Seen(HashMap<u64, (Instant, bool)>);

impl Seen {
    /// The connections of `now_open` that have sent nothing for `after`
    /// since first seen (each returned once); forgets closed ones.
    fn overdue(&mut self, now_open: &[Accepted], now: Instant, after: Duration) -> Vec<Accepted> {
        self.0
            .retain(|ino, _| now_open.iter().any(|c| c.inode == *ino));
        let mut out = Vec::new();
        for c in now_open {
            let (since, dropped) = self.0.entry(c.inode).or_insert((now, false));
            if *dropped || now.duration_since(*since) < after {
                continue;
            }
            if net::tcp_bytes(c.fd).is_some_and(|b| b.received == 0) {
                *dropped = true;
                out.push(*c);
            } else {
                *dropped = true; // it spoke: never looked at again
            }
        }
        out
    }
}

/// Shut `c` down (both directions) if its fd is still that socket.
fn drop_client(c: Accepted, after: Duration) {
    if inode_of(c.fd) != Some(c.inode) {
        return; // closed meanwhile
    }
    // The fd was this connection's socket a moment ago (checked above); the
    // server only closes it after its read fails, which this very call
    // causes, so it is still that socket.
    // SAFETY: shutdown on an fd touches no memory; a stale fd only fails.
    let rc = unsafe { libc::shutdown(c.fd, libc::SHUT_RDWR) };
    if rc == 0 {
        super::error::tell(format!(
            "rpc-server: dropped the client {}: it sent nothing within {} s of connecting \
             (--first-byte-timeout); the server takes the next client",
            c.peer,
            after.as_secs()
        ));
    }
}

/// Watch the server's accepted connections on `port` from a thread of its
/// own for as long as the process runs.
pub fn guard(port: u16, after: Duration) -> std::io::Result<()> {
    debug_assert!(after > Duration::ZERO);
    std::thread::Builder::new()
        .name("rpc-first-byte".into())
        .spawn(move || {
            let mut seen = Seen::default();
            loop {
                std::thread::sleep(POLL);
                for c in seen.overdue(&accepted(port), Instant::now(), after) {
                    drop_client(c, after);
                }
            }
        })
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn socket_links_name_their_inode() {
        assert_eq!(socket_inode("socket:[12345]"), Some(12345));
        assert_eq!(socket_inode("pipe:[12345]"), None);
        assert_eq!(socket_inode("/dev/null"), None);
    }

    #[test]
    fn a_silent_connection_is_overdue_and_a_talking_one_is_not() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (a, _) = l.accept().unwrap();
        let mut talker = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut b, _) = l.accept().unwrap();
        talker.write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        b.read_exact(&mut one).unwrap();
        let open = accepted(port);
        assert_eq!(open.len(), 2, "{open:?}");
        let t0 = Instant::now();
        let mut seen = Seen::default();
        let after = Duration::from_secs(5);
        assert!(seen.overdue(&open, t0, after).is_empty());
        let late = seen.overdue(&open, t0 + after, after);
        assert_eq!(late.len(), 1, "{late:?}");
        use std::os::fd::AsRawFd;
        assert_eq!(late[0].fd, a.as_raw_fd());
        // Each one once.
        assert!(seen.overdue(&open, t0 + after * 2, after).is_empty());
        drop(b);
    }
}
