//! `--rpc`: the last layers of the model on llama.cpp RPC hosts, resident in
//! their memory, while this host streams the experts of the layers it keeps.
//! The hosts are reached (and refused with their address when down) before
//! the load; the layout then covers only the local layers, so the flash
//! actor, the cache budget, the mapping drop and the hook never see a
//! remote tensor. [`RemoteClock`] times the remote part of every decode.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bmoe_decode::metrics::DecodeMetrics;

use super::config::RunConfig;
use super::error::EngineError;
use super::note::{Note, RpcSplit};
use super::refusal::Refusal;
use super::rpc_config::{RpcConfig, RpcLayers};
use crate::generate::GenerateError;
use crate::layout::{MoeLayout, RemoteShare};
use crate::llama::rpc::net::{self, NetBytes};
use crate::llama::rpc::{self, RpcHosts};
use crate::llama::{BatchShape, EvalObserver, NodeView};

/// The hosts of a run and what they hold.
pub(super) struct RpcRun {
    pub(super) hosts: RpcHosts,
    pub(super) share: RemoteShare,
    /// Raised by the decode's [`RemoteClock`] while it waits on the hosts.
    pub(super) waiting: Arc<AtomicBool>,
}

/// Reach the hosts, decide the layers they hold and hand those off in
/// `layout` (None without `--rpc`).
pub(super) fn attach(
    cfg: &RunConfig,
    layout: &mut MoeLayout,
    notes: &mut Vec<Note>,
) -> Result<Option<RpcRun>, EngineError> {
    let Some(rc) = &cfg.rpc else { return Ok(None) };
    if cfg.speculation.source.head().is_some() {
        return Err(Refusal::RpcWithMtp.into());
    }
    // A count is known before the hosts are asked: a pairing it makes
    // pointless is refused without reaching them.
    match rc.layers {
        RpcLayers::Count(n) if n <= layout.blocks() => {
            route_trace_needs_local_experts(route_trace(cfg), layout, n)?
        }
        _ => {}
    }
    let hosts = rpc::connect(&rc.endpoints).map_err(crate::llama::LlamaError::from)?;
    let free = hosts.free_bytes();
    let blocks = match rc.layers {
        RpcLayers::Auto => layout.blocks_fitting(free),
        RpcLayers::Count(n) if n > layout.blocks() => {
            return Err(Refusal::RpcLayers {
                n,
                model: cfg.model.clone(),
                blocks: layout.blocks(),
            }
            .into())
        }
        RpcLayers::Count(n) => n,
    };
    if layout.remote_bytes(blocks) > free {
        return Err(Refusal::RpcTooSmall {
            blocks,
            need_mib: mib(layout.remote_bytes(blocks)),
            free_mib: mib(free),
        }
        .into());
    }
    route_trace_needs_local_experts(route_trace(cfg), layout, blocks)?;
    let share = layout.hand_off(blocks).clone();
    notes.push(Note::RpcSplit(RpcSplit {
        share: share.clone(),
        endpoints: hosts.endpoints.clone(),
        free_bytes: hosts.free_bytes(),
        blocks: layout.blocks(),
    }));
    Ok(Some(RpcRun {
        hosts,
        share,
        waiting: Arc::default(),
    }))
}

/// Whether a layer with experts stays here when the last `remote_blocks`
/// blocks go to the hosts.
fn experts_stay_here(layout: &MoeLayout, remote_blocks: u32) -> bool {
    let first_remote = layout.blocks().saturating_sub(remote_blocks);
    layout.experts.iter().any(|e| e.layer < first_remote)
}

/// `--route-trace` records the demands of the experts streamed here: with
/// every layer that has experts on the hosts it would record nothing, so
/// the pairing is refused (exit 2) rather than leaving no file.
fn route_trace_needs_local_experts(
    trace: Option<&Path>,
    layout: &MoeLayout,
    remote_blocks: u32,
) -> Result<(), EngineError> {
    match trace {
        Some(t) if layout.is_moe() && !experts_stay_here(layout, remote_blocks) => {
            Err(Refusal::RouteTraceAllRemote {
                trace: t.to_path_buf(),
                remote_blocks,
                most: last_count_keeping_experts(layout),
            }
            .into())
        }
        _ => Ok(()),
    }
}

/// `--route-trace`, on a streamed run.
fn route_trace(cfg: &RunConfig) -> Option<&Path> {
    cfg.mode.stream().and_then(|s| s.route_trace.as_deref())
}

/// The most blocks the hosts may take while a layer with experts stays here.
fn last_count_keeping_experts(layout: &MoeLayout) -> u32 {
    let first_moe = layout.experts.iter().map(|e| e.layer).min().unwrap_or(0);
    layout.blocks().saturating_sub(first_moe + 1)
}

/// A NaN under `--rpc`: what the hosts hold is as suspect as the model
/// file (a damaged cache file of theirs, say), so the message names both.
pub(super) fn blame_hosts(e: EngineError, rpc: Option<&RpcConfig>) -> EngineError {
    let Some(rc) = rpc else { return e };
    match e {
        EngineError::Generate(GenerateError::NanLogits) => EngineError::NanWithRpc {
            endpoints: rc.endpoints.clone(),
        },
        EngineError::Failed { cause, done_line } => EngineError::Failed {
            cause: Box::new(blame_hosts(*cause, rpc)),
            done_line,
        },
        e => e,
    }
}

fn mib(b: u64) -> u64 {
    b / (1024 * 1024)
}

/// The RPC hosts' part of each decode: from the last local layer's output
/// (`l_out-N`, asked of the scheduler so it reports its end) to the end of
/// the decode (a `rpc.remote` span in the trace), and the bytes that
/// crossed the network. Wraps the context's own observer (the streaming
/// hook), or none when resident.
pub(crate) struct RemoteClock {
    inner: Option<Box<dyn EvalObserver>>,
    /// `l_out-{first remote block - 1}`; empty when every layer is remote.
    boundary: String,
    /// Whether the remote part is timed apart (false: a resident run with
    /// local blocks, which watches no node so ggml can reuse its graph).
    timed: bool,
    inner_wants_boundary: bool,
    local_done: Option<Instant>,
    remote: Duration,
    span: Option<tracing::span::EnteredSpan>,
    /// The hosts, the bytes to and from them at the last decode's end, and
    /// those since the last hand-out.
    peers: Vec<SocketAddr>,
    net: NetBytes,
    net_bytes: u64,
    /// Raised while the decode waits on the hosts (the stall watchdog reads it).
    waiting: Arc<AtomicBool>,
}

impl RemoteClock {
    pub(crate) fn new(
        inner: Option<Box<dyn EvalObserver>>,
        first_remote: u32,
        peers: Vec<SocketAddr>,
        waiting: Arc<AtomicBool>,
    ) -> Self {
        // A resident run sets no node callback when blocks stay here: ggml's
        // scheduler then computes the hosts' split as one graph whose id
        // survives from decode to decode, so its RPC client resends only the
        // inputs, not the graph (docs/scale-out.md); the remote part is not
        // timed apart then.
        let timed = inner.is_some() || first_remote == 0;
        let boundary = match first_remote {
            _ if !timed => String::new(),
            0 => String::new(),
            n => format!("l_out-{}", n - 1),
        };
        Self {
            inner,
            boundary,
            timed,
            inner_wants_boundary: false,
            local_done: None,
            remote: Duration::ZERO,
            span: None,
            // What crossed during the load is not a decode's.
            net: net::bytes_to(&peers),
            peers,
            net_bytes: 0,
            waiting,
        }
    }

    /// The remote part begins (its span opens).
    fn remote_begins(&mut self, at: Instant) {
        self.local_done = Some(at);
        self.waiting.store(true, Ordering::Relaxed);
        let span = tracing::debug_span!("rpc.remote", net_bytes = tracing::field::Empty);
        self.span = Some(span.entered());
    }
}

impl EvalObserver for RemoteClock {
    fn watches_nodes(&self) -> bool {
        self.inner.is_some() || !self.boundary.is_empty()
    }

    fn wants(&mut self, node: &NodeView<'_>) -> bool {
        let inner = self.inner.as_mut().is_some_and(|o| o.wants(node));
        if !self.boundary.is_empty() && node.name() == self.boundary {
            self.inner_wants_boundary = inner;
            return true;
        }
        inner
    }

    fn observe(&mut self, node: &NodeView<'_>) {
        let at_boundary = !self.boundary.is_empty() && node.name() == self.boundary;
        if at_boundary {
            self.remote_begins(Instant::now());
        }
        if !at_boundary || self.inner_wants_boundary {
            if let Some(o) = self.inner.as_mut() {
                o.observe(node);
            }
        }
    }

    fn decode_begin(&mut self, batch: BatchShape) {
        let now = Instant::now();
        self.local_done = None;
        if self.boundary.is_empty() {
            self.remote_begins(now);
        }
        if let Some(o) = self.inner.as_mut() {
            o.decode_begin(batch);
        }
    }

    fn decode_end(&mut self) {
        if let Some(o) = self.inner.as_mut() {
            o.decode_end();
        }
        if let Some(t) = self.local_done.take().filter(|_| self.timed) {
            self.remote += t.elapsed();
        }
        self.waiting.store(false, Ordering::Relaxed);
        let net = net::bytes_to(&self.peers);
        let crossed = net.since(self.net).total();
        self.net = net;
        self.net_bytes += crossed;
        if let Some(span) = self.span.take() {
            span.record("net_bytes", crossed);
        }
    }

    fn take_metrics(&mut self) -> DecodeMetrics {
        let mut m = self
            .inner
            .as_mut()
            .map(|o| o.take_metrics())
            .unwrap_or_default();
        m.remote += std::mem::take(&mut self.remote);
        m.net_bytes += std::mem::take(&mut self.net_bytes);
        m
    }

    fn failure(&self) -> Option<crate::llama::ObserverFailure> {
        self.inner.as_ref().and_then(|o| o.failure())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rpc_config::DEFAULT_RPC_TIMEOUT;

    #[test]
    fn a_route_trace_needs_a_layer_with_experts_left_here() {
        let l = crate::layout::two_blocks();
        assert!(experts_stay_here(&l, 0));
        assert!(experts_stay_here(&l, 1));
        assert!(!experts_stay_here(&l, 2));
        assert!(!experts_stay_here(&l, 3));
        assert_eq!(last_count_keeping_experts(&l), 1);
        assert!(
            route_trace_needs_local_experts(None, &l, 2).is_ok(),
            "no trace asked"
        );
        let t = Some(Path::new("t.bmrt"));
        assert!(route_trace_needs_local_experts(t, &l, 1).is_ok());
        let e = route_trace_needs_local_experts(t, &l, 2).unwrap_err();
        assert!(
            matches!(e, EngineError::Refused(Refusal::RouteTraceAllRemote { .. })),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("nothing to record") && msg.contains("at most 1"),
            "{msg}"
        );
    }

    #[test]
    fn a_nan_under_rpc_names_the_hosts_too() {
        let nan = || EngineError::Generate(GenerateError::NanLogits);
        let rc = RpcConfig {
            endpoints: vec!["127.0.0.1:9".into(), "10.0.0.2:50052".into()],
            layers: RpcLayers::Auto,
            timeout: DEFAULT_RPC_TIMEOUT,
        };
        assert!(matches!(blame_hosts(nan(), None), EngineError::Generate(_)));
        let e = blame_hosts(nan(), Some(&rc)).to_string();
        assert!(e.contains("RPC hosts 127.0.0.1:9,10.0.0.2:50052"), "{e}");
        assert!(e.contains("model file here"), "{e}");
        let failed = EngineError::Failed {
            cause: Box::new(nan()),
            done_line: "{}".into(),
        };
        let EngineError::Failed { cause, .. } = blame_hosts(failed, Some(&rc)) else {
            panic!("not kept as a failure")
        };
        assert!(matches!(*cause, EngineError::NanWithRpc { .. }));
        let other = blame_hosts(Refusal::RpcWithMtp.into(), Some(&rc));
        assert!(matches!(other, EngineError::Refused(_)));
    }

    #[test]
    fn layer_counts_parse_and_nonsense_is_explained() {
        assert_eq!("auto".parse(), Ok(RpcLayers::Auto));
        assert_eq!("12".parse(), Ok(RpcLayers::Count(12)));
        assert!("-1".parse::<RpcLayers>().unwrap_err().contains("auto"));
    }

    /// A streaming hook that wants no node.
    struct Blind;
    impl EvalObserver for Blind {
        fn wants(&mut self, _: &NodeView<'_>) -> bool {
            false
        }
        fn observe(&mut self, _: &NodeView<'_>) {}
    }

    #[test]
    fn the_clock_times_from_the_last_local_layer_and_keeps_nothing_without_it() {
        let mut c = RemoteClock::new(Some(Box::new(Blind)), 5, Vec::new(), Arc::default());
        assert_eq!(c.boundary, "l_out-4");
        assert!(c.watches_nodes());
        c.decode_begin(BatchShape::default());
        c.decode_end();
        // The boundary never ran: nothing is counted as remote.
        assert_eq!(c.take_metrics().remote, Duration::ZERO);
        let mut all = RemoteClock::new(None, 0, Vec::new(), Arc::default());
        assert!(
            !all.watches_nodes(),
            "all remote: the decode is the remote part"
        );
        all.decode_begin(BatchShape::default());
        std::thread::sleep(Duration::from_millis(2));
        all.decode_end();
        assert!(all.take_metrics().remote >= Duration::from_millis(2));
    }

    #[test]
    fn a_resident_split_watches_no_node_and_times_no_remote_part() {
        let waiting = Arc::new(AtomicBool::new(false));
        let mut c = RemoteClock::new(None, 5, Vec::new(), waiting.clone());
        assert!(!c.watches_nodes(), "no callback: ggml may reuse the graph");
        c.decode_begin(BatchShape::default());
        assert!(
            waiting.load(Ordering::Relaxed),
            "the watchdog covers the decode"
        );
        std::thread::sleep(Duration::from_millis(2));
        c.decode_end();
        assert!(!waiting.load(Ordering::Relaxed));
        assert_eq!(c.take_metrics().remote, Duration::ZERO);
    }
}
