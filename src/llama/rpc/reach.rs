//! Reaching an RPC host before ggml's client does: ggml aborts on any failure
//! and waits without a timeout, so bmoe first resolves the address as ggml's
//! transport does (IPv4 only), connects, and sends the protocol's greeting
//! (`HELLO`, the first message of every client) with a deadline, so a host
//! that is down, busy with another client, silent or of another protocol
//! version is refused with its address and the reason.

use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::error::{RpcError, PROTOCOL_MAJOR, PROTOCOL_MINOR, PROTOCOL_VERSION};

/// How long the connect and the greeting's answer may each take.
pub(super) const REACH_TIMEOUT: Duration = Duration::from_secs(5);
/// `RPC_CMD_HELLO` (ggml-rpc.cpp: "must be always 14").
const CMD_HELLO: u8 = 14;
/// The greeting's request (connection capabilities) and answer (major,
/// minor, patch, padding, capabilities) sizes in protocol 7.
const CAPS_BYTES: usize = 24;
const ANSWER_BYTES: u64 = 4 + CAPS_BYTES as u64;

/// A greeting's answer longer than this is not one: the host is not a ggml
/// RPC server (its first bytes read as a length would be huge).
const MAX_PLAUSIBLE_ANSWER_BYTES: u64 = 4096;

/// What a host that answered the greeting with something else said, in
/// words: its first bytes as text where they are printable.
fn not_rpc(first: &[u8; 8]) -> String {
    let shown: String = first
        .iter()
        .map(|&b| match b {
            0x20..=0x7e => b as char,
            _ => '.',
        })
        .collect();
    format!(
        "it answered the RPC greeting with something else (its first bytes: {shown:?}): not a \
         llama.cpp RPC server (bmoe rpc-server or ggml's rpc-server), or another program on that port"
    )
}

/// `HOST:PORT` to the IPv4 address ggml's transport would use (it speaks
/// IPv4 only and splits at the first colon).
pub fn resolve(endpoint: &str) -> Result<SocketAddrV4, RpcError> {
    let bad = || RpcError::BadAddress(endpoint.to_string());
    let (host, port) = endpoint.split_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    let unreachable = |reason: String| RpcError::Unreachable {
        endpoint: endpoint.to_string(),
        reason,
    };
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| unreachable(format!("cannot resolve {host}: {e}")))?;
    addrs
        .filter_map(|a| match a {
            SocketAddr::V4(v4) => Some(v4),
            SocketAddr::V6(_) => None,
        })
        .next()
        .ok_or_else(|| {
            unreachable(format!(
                "{host} has no IPv4 address (llama.cpp's RPC speaks IPv4)"
            ))
        })
}

/// Connect to `addr` and exchange the greeting, each within `timeout`: Ok
/// when it answers in this protocol's version.
pub fn greet(endpoint: &str, addr: SocketAddrV4, timeout: Duration) -> Result<(), RpcError> {
    let unreachable = |reason: String| RpcError::Unreachable {
        endpoint: endpoint.to_string(),
        reason,
    };
    let mut s = TcpStream::connect_timeout(&addr.into(), timeout)
        .map_err(|e| unreachable(e.to_string()))?;
    let silent = |e: std::io::Error| {
        unreachable(format!(
            "it accepted the connection but did not answer the RPC greeting within {:.1} s ({e}): \
             busy with another client (ggml's server takes one at a time) or not an RPC server",
            timeout.as_secs_f64()
        ))
    };
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    let mut hello = vec![CMD_HELLO];
    hello.extend_from_slice(&(CAPS_BYTES as u64).to_le_bytes());
    hello.extend_from_slice(&[0u8; CAPS_BYTES]);
    s.write_all(&hello).map_err(silent)?;
    let mut size = [0u8; 8];
    s.read_exact(&mut size).map_err(silent)?;
    let raw = size;
    let size = u64::from_le_bytes(size);
    if size > MAX_PLAUSIBLE_ANSWER_BYTES {
        return Err(unreachable(not_rpc(&raw)));
    }
    if size != ANSWER_BYTES {
        return Err(RpcError::Version {
            endpoint: endpoint.to_string(),
            theirs: format!(
                "another (its greeting's answer is {size} bytes, protocol 7's {ANSWER_BYTES})"
            ),
            ours: PROTOCOL_VERSION,
        });
    }
    let mut answer = [0u8; ANSWER_BYTES as usize];
    s.read_exact(&mut answer).map_err(silent)?;
    let (major, minor, patch) = (answer[0], answer[1], answer[2]);
    if major != PROTOCOL_MAJOR || minor > PROTOCOL_MINOR {
        return Err(RpcError::Version {
            endpoint: endpoint.to_string(),
            theirs: format!("{major}.{minor}.{patch}"),
            ours: PROTOCOL_VERSION,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_ipv4_host_and_port() {
        assert_eq!(
            resolve("127.0.0.1:50052").unwrap().to_string(),
            "127.0.0.1:50052"
        );
        assert!(resolve("localhost:9").unwrap().ip().is_loopback());
        for bad in [
            "127.0.0.1",
            "localhost:notaport",
            "",
            ":",
            ":80",
            "[::1]:80",
            "::1:80",
        ] {
            assert!(
                matches!(resolve(bad), Err(RpcError::BadAddress(_))),
                "{bad}"
            );
        }
        let e = resolve("no-such-host.invalid:80").unwrap_err();
        assert!(matches!(e, RpcError::Unreachable { .. }), "{e}");
    }

    /// Issue 64, finding 9: garbage is "not an RPC server", not a
    /// protocol "another" with a 19-digit greeting size.
    #[test]
    fn a_host_answering_garbage_is_not_an_rpc_server() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(addr) = l.local_addr().unwrap() else {
            unreachable!()
        };
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut hello = [0u8; 33];
            let _ = c.read_exact(&mut hello);
            let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        });
        let e = greet("h:1", addr, Duration::from_secs(5))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not a llama.cpp RPC server") && e.contains("HTTP/1.1"),
            "{e}"
        );
        assert!(!e.contains("byte greeting"), "{e}");
        server.join().unwrap();
    }

    #[test]
    fn a_host_that_accepts_but_never_answers_is_refused_as_silent() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(addr) = l.local_addr().unwrap() else {
            unreachable!()
        };
        // Accepted by the kernel's backlog, never read: a busy ggml server.
        let e = greet("h:1", addr, Duration::from_millis(200)).unwrap_err();
        assert!(
            e.to_string().contains("did not answer the RPC greeting"),
            "{e}"
        );
        drop(l);
    }
}
