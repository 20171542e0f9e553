//! `--rpc` (run, chat, serve) and `bmoe rpc-server`: llama.cpp's RPC backend
//! through the same binary on both sides (docs/scale-out.md).

use std::net::{IpAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;

use super::usage::UsageError;
use bmoe::engine::{RpcConfig, RpcLayers};
use bmoe::llama::rpc::ServerOptions;

#[derive(Debug, Args)]
pub struct RpcArgs {
    /// Put the model's last layers on llama.cpp RPC hosts, each running
    /// `bmoe rpc-server` (same bmoe build): HOST:PORT, comma-separated. Their
    /// layers stay resident in the hosts' memory; the local ones stream.
    #[arg(long, value_name = "HOST:PORT,...", value_delimiter = ',')]
    pub rpc: Vec<String>,
    /// With --rpc: how many of the last layers (blocks, as `bmoe inspect`
    /// counts them) the hosts hold, with the output layer; auto: as many as
    /// their reported free memory holds.
    #[arg(long, value_name = "N|auto", default_value = "auto", requires = "rpc")]
    pub rpc_layers: RpcLayers,
    /// With --rpc: a decode that hears nothing from the hosts for this many
    /// seconds has lost one (exit 5). Raise it for long prompts on slow hosts.
    #[arg(long, value_name = "SECS", default_value_t = 30, requires = "rpc", value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub rpc_timeout: u64,
}

impl RpcArgs {
    /// The engine's `--rpc` configuration (None without `--rpc`).
    pub fn config(&self) -> Option<RpcConfig> {
        (!self.rpc.is_empty()).then(|| RpcConfig {
            endpoints: self.rpc.clone(),
            layers: self.rpc_layers,
            timeout: Duration::from_secs(self.rpc_timeout),
        })
    }
}

#[derive(Debug, Args)]
pub struct RpcServerArgs {
    /// IPv4 address to listen on. Loopback by default; any other needs --allow-remote.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to listen on.
    #[arg(short, long, default_value_t = 50052)]
    pub port: u16,
    /// Compute threads (default: all cores).
    #[arg(short, long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: Option<u32>,
    /// Keep the large tensors clients send in this folder (by hash), so a
    /// later load of the same model sends only their hashes. Every file is
    /// checked against its hash at start and once written; a damaged one is
    /// removed (and sent again by the next client).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Drop a client that sends nothing this many seconds after connecting
    /// (ggml's server takes one client at a time: a silent one would hold it).
    #[arg(long, value_name = "SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub first_byte_timeout: u64,
    /// Listen on an address other than loopback. The RPC protocol has no
    /// authentication or encryption: whoever reaches the port can use this
    /// host's memory and CPU. Only on a network you trust.
    #[arg(long)]
    pub allow_remote: bool,
}

/// `bmoe rpc-server`: ggml's RPC server on this host's CPU, until killed.
pub fn rpc_server(args: RpcServerArgs) -> Result<()> {
    let IpAddr::V4(ip) = args.host else {
        return Err(UsageError(format!(
            "rpc-server --host {}: llama.cpp's RPC transport speaks IPv4 only; give an IPv4 address",
            args.host
        ))
        .into());
    };
    if !args.host.is_loopback() && !args.allow_remote {
        return Err(UsageError(format!(
            "rpc-server --host {}: not a loopback address, and the RPC protocol has no \
             authentication; add --allow-remote to listen there anyway (a trusted network only)",
            args.host
        ))
        .into());
    }
    if !args.host.is_loopback() {
        bmoe::say!(
            "warning: listening on {} without authentication: anyone who reaches its port can \
             use this host's memory and CPU",
            args.host,
        );
    }
    if let Some(d) = &args.cache {
        bmoe::llama::rpc::cache::prepare(d).map_err(|e| UsageError(e.to_string()))?;
    }
    // ggml's server loop has no stop: a signal ends the process as usual.
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: restoring a signal's default disposition touches no memory.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    let opts = ServerOptions {
        addr: SocketAddrV4::new(ip, args.port),
        cache_dir: args.cache.as_deref(),
        threads: args.threads.unwrap_or_else(bmoe::llama::default_threads),
        first_byte_timeout: Duration::from_secs(args.first_byte_timeout),
    };
    bmoe::llama::rpc::serve(&opts)?;
    Ok(())
}
