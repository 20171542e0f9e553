//! The summary's `rpc:` line: the hosts' share of a token's time and the
//! network bytes per token, beside the least a decode must move (the hidden
//! state out to each host, the logits back) and their ratio, so the
//! protocol's overhead (ggml's RPC client resends the serialized graph
//! with every decode, docs/scale-out.md) is visible.

use super::note::Note;
use super::report::mean;
use super::run_report::RunReport;

const KIB: f64 = 1024.0;

/// The least one decode moves over the network: bytes out (the hidden
/// state, `n_embd` f32, to each of `hosts`, which hand it on through this
/// process) and back (the logits, `n_vocab` f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Payload {
    pub(crate) out_bytes: u64,
    pub(crate) back_bytes: u64,
}

impl Payload {
    pub(crate) fn of(n_embd: u64, n_vocab: u64, hosts: u64) -> Self {
        debug_assert!(hosts > 0, "a split has a host");
        Self {
            out_bytes: n_embd * 4 * hosts,
            back_bytes: n_vocab * 4,
        }
    }

    /// `= R x the activations out (A KiB) and logits back (L KiB)` for a
    /// decode that moved `net_kib`.
    fn beside(&self, net_kib: f64) -> String {
        let least = (self.out_bytes + self.back_bytes) as f64 / KIB;
        format!(
            " = {:.2}x the activations out ({:.1} KiB) and logits back ({:.1} KiB)",
            if least > 0.0 { net_kib / least } else { 0.0 },
            self.out_bytes as f64 / KIB,
            self.back_bytes as f64 / KIB
        )
    }
}

impl RunReport {
    /// The payload of this run's split (None without `--rpc` or where the
    /// header lacks the widths).
    fn payload(&self) -> Option<Payload> {
        let ctx = self.layout.ctx.as_ref()?;
        let hosts = self.notes.iter().find_map(|n| match n {
            Note::RpcSplit(s) => Some(s.endpoints.len() as u64),
            _ => None,
        })?;
        Some(Payload::of(ctx.n_embd, ctx.n_vocab, hosts.max(1)))
    }

    /// `--rpc`: the hosts' share of a token's time and the network bytes
    /// (per generated token, beside the payload; the prefill's on its own).
    pub(super) fn rpc_line(&self) -> Option<String> {
        let rows = || self.decode_rows();
        let n = rows().count();
        let net: u64 = self.rows.iter().map(|r| r.remote.net_bytes).sum();
        let remote: f64 = self.rows.iter().map(|r| r.remote.remote_ms).sum();
        if net == 0 && remote == 0.0 {
            return None;
        }
        let wall = mean(rows().map(|r| r.cost.wall_ms).sum(), n);
        let rem = mean(rows().map(|r| r.remote.remote_ms).sum(), n);
        let kib = mean(rows().map(|r| r.remote.net_bytes as f64).sum(), n) / KIB;
        let beside = self.payload().map(|p| p.beside(kib)).unwrap_or_default();
        let pre = self.rows.iter().find(|r| r.prefill);
        let pre_kib = pre.map_or(0.0, |r| r.remote.net_bytes as f64 / KIB);
        let (part, prefill) = match remote {
            0.0 => (
                format!(
                    "remote part not timed apart ({wall:.1} ms/token in all: a resident run \
                     watches no node, so ggml reuses the hosts' graph)"
                ),
                format!("prefill {pre_kib:.1} KiB"),
            ),
            _ => (
                format!(
                    "remote part {rem:.1} ms/token ({:.0}% of {wall:.1} ms)",
                    if wall > 0.0 { rem * 100.0 / wall } else { 0.0 }
                ),
                format!(
                    "prefill {:.1} ms remote, {pre_kib:.1} KiB",
                    pre.map_or(0.0, |r| r.remote.remote_ms)
                ),
            ),
        };
        Some(format!(
            "rpc: {part}, network {kib:.1} KiB/token{beside}; {prefill}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_is_the_hidden_state_per_host_and_the_logits() {
        // SmolLM2: 576 wide, 49,152 tokens.
        let p = Payload::of(576, 49_152, 1);
        assert_eq!((p.out_bytes, p.back_bytes), (2304, 196_608));
        assert_eq!(Payload::of(576, 49_152, 2).out_bytes, 4608);
        // 472 KiB a token against 2.25 + 192 KiB.
        let s = p.beside(472.0);
        assert_eq!(
            s,
            " = 2.43x the activations out (2.2 KiB) and logits back (192.0 KiB)"
        );
        assert!(Payload::of(0, 0, 1).beside(1.0).contains(" 0.00x"));
    }
}
