//! What can go wrong with RPC hosts, the protocol version both sides must
//! share, and the operator's line on stderr.

/// A line on stderr for the server's operator (the seam writes its own
/// lines; it does not import `stdio`).
pub(super) fn tell(line: String) {
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{line}\n").as_bytes());
}

/// The exit code of a run that lost an RPC host (refused at start, dropped or
/// stalled mid-run, or another protocol version).
pub const EXIT_REMOTE_LOST: i32 = 5;

/// The RPC protocol version of this build (`ggml-rpc.h`).
pub const PROTOCOL_VERSION: &str = "7.0.0";
pub(super) const PROTOCOL_MAJOR: u8 = 7;
pub(super) const PROTOCOL_MINOR: u8 = 0;

/// What can go wrong with RPC hosts.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("--rpc {0:?}: give IPv4 HOST:PORT (e.g. 127.0.0.1:50052), each host once")]
    BadAddress(String),
    #[error("--rpc: duplicate host {0}; give each host once")]
    Duplicate(String),
    #[error(
        "the RPC host {endpoint} speaks protocol {theirs}, this bmoe {ours}: run the same bmoe \
         build on both sides"
    )]
    Version {
        endpoint: String,
        theirs: String,
        ours: &'static str,
    },
    #[error("the RPC stall watchdog could not start: {0}")]
    Watchdog(String),
    #[error(
        "cannot reach the RPC host {endpoint}: {reason}; start `bmoe rpc-server` there \
         (same bmoe version) or drop it from --rpc"
    )]
    Unreachable { endpoint: String, reason: String },
    #[error("the RPC host {0} reports no devices")]
    NoDevices(String),
    #[error("rpc-server: cannot listen on {endpoint}: {reason}")]
    Listen { endpoint: String, reason: String },
    #[error("rpc-server on {0} stopped (ggml's server returned: see its messages above)")]
    ServerStopped(String),
    #[error("rpc-server --cache {dir}: {reason}")]
    Cache { dir: String, reason: String },
    #[error("rpc-server: cannot start the first-byte deadline's thread: {0}")]
    Doorman(String),
}
