//! `--rpc`'s settings: the hosts, how many layers they take, how long a
//! decode waits on them.

use std::str::FromStr;
use std::time::Duration;

/// `--rpc-timeout`'s default: a decode that hears nothing from the hosts for
/// this long has lost one.
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// `--rpc HOST:PORT,...` with `--rpc-layers` and `--rpc-timeout`.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcConfig {
    pub endpoints: Vec<String>,
    pub layers: RpcLayers,
    pub timeout: Duration,
}

/// How many trailing layers go to the hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcLayers {
    /// As many as the hosts' reported free memory holds.
    Auto,
    Count(u32),
}

impl FromStr for RpcLayers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            n => n
                .parse()
                .map(Self::Count)
                .map_err(|_| format!("{s:?}: give a layer count or auto")),
        }
    }
}
