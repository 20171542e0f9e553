//! Bytes that crossed the network to the RPC hosts, from the kernel's own
//! counters: the process's TCP sockets whose peer is one of the hosts
//! (found through `/proc/self/fd`, since ggml owns the sockets), each asked
//! for `TCP_INFO` (`tcpi_bytes_acked`, `tcpi_bytes_received`, Linux 4.1+).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;

/// Bytes sent (acknowledged by the peer) and received, over all sockets to
/// the hosts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NetBytes {
    pub sent: u64,
    pub received: u64,
}

impl NetBytes {
    pub fn total(&self) -> u64 {
        self.sent + self.received
    }

    /// What crossed since `before` (counters of closed sockets drop out, so
    /// a difference is never negative).
    pub fn since(&self, before: NetBytes) -> NetBytes {
        NetBytes {
            sent: self.sent.saturating_sub(before.sent),
            received: self.received.saturating_sub(before.received),
        }
    }
}

/// The sockets of this process connected to `peers`, summed now.
pub fn bytes_to(peers: &[SocketAddr]) -> NetBytes {
    let mut sum = NetBytes::default();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return sum;
    };
    for entry in dir.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<RawFd>().ok())
        else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"));
        if !is_socket || !peer_of(fd).is_some_and(|p| peers.contains(&p)) {
            continue;
        }
        if let Some(b) = tcp_bytes(fd) {
            sum.sent += b.sent;
            sum.received += b.received;
        }
    }
    sum
}

/// The socket's peer address (None for a socket that has none or no IP one).
pub(super) fn peer_of(fd: RawFd) -> Option<SocketAddr> {
    address_of(fd, libc::getpeername)
}

/// The socket's own address (None for a socket that has no IP one).
pub(super) fn local_of(fd: RawFd) -> Option<SocketAddr> {
    address_of(fd, libc::getsockname)
}

type AddressCall =
    unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int;

/// One of the socket's addresses, as `call` (getpeername or getsockname) gives it.
fn address_of(fd: RawFd, call: AddressCall) -> Option<SocketAddr> {
    // SAFETY: a zeroed sockaddr_storage is a valid out-buffer of the stated length.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `ss` and `len` are valid for writes; a stale fd only makes the
    // call fail (EBADF / ENOTSOCK), which is handled.
    let rc = unsafe {
        call(
            fd,
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a: libc::sockaddr_in =
                unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(a.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a: libc::sockaddr_in6 =
                unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::new(IpAddr::V6(ip), u16::from_be(a.sin6_port)))
        }
        _ => None,
    }
}

/// The kernel's byte counters of one TCP socket.
pub(super) fn tcp_bytes(fd: RawFd) -> Option<NetBytes> {
    // SAFETY: a zeroed tcp_info is a valid out-buffer of the stated length.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are valid for writes; the kernel writes at most `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(NetBytes {
        sent: info.tcpi_bytes_acked,
        received: info.tcpi_bytes_received,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn bytes_to_a_peer_are_counted_and_others_are_not() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let before = bytes_to(&[addr]);
        c.write_all(&[7u8; 10_000]).unwrap();
        let mut buf = vec![0u8; 10_000];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf[..3000]).unwrap();
        c.read_exact(&mut buf[..3000]).unwrap();
        let d = bytes_to(&[addr]).since(before);
        assert_eq!(d.sent, 10_000, "{d:?}");
        assert_eq!(d.received, 3000, "{d:?}");
        let other: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(bytes_to(&[other]), NetBytes::default());
    }
}
