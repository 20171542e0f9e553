//! The decode rate to expect before a run (`bmoe inspect MODEL --forecast`):
//! from the header's bytes, this host's measured read bandwidth and kernel
//! rate (or, better, a short streamed decode of the model itself at cache 0:
//! its compute outside flash waits and its own read rate), MemAvailable, and
//! a hit-rate curve (a route trace of the model replayed through the cache,
//! or the published real routing of docs/cache.md). Pure functions of those
//! facts; the CLI measures them.

pub mod depth;

use crate::layout::MoeLayout;
use crate::stream::compute_estimate_bytes;

pub use depth::{DepthFit, DepthSample};

const MIB: f64 = 1024.0 * 1024.0;

/// What this host measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostFacts {
    /// Random expert-slice reads of this model's file (the read probe).
    pub read_bytes_per_s: f64,
    /// Weight bytes per second through ggml's product kernel for the
    /// model's expert type.
    pub weight_bytes_per_s: f64,
    /// Reads into memory never touched before (a cache still filling).
    pub fresh_read_bytes_per_s: f64,
    /// One graph segment's fixed cost on a sleeping thread pool, in seconds
    /// (a streamed decode runs one per routed layer).
    pub segment_s: f64,
    pub mem_available_bytes: u64,
    /// A short streamed decode of the model at cache 0, when it was run:
    /// it replaces the kernel model's compute and the probe's read rate.
    pub decode: Option<DecodeProbe>,
    /// The compute probe's seconds per token at full depth (`--compute-probe
    /// depth`, [`DepthFit::compute_s`]), when it ran: it replaces the decode
    /// probe's compute and the kernel model.
    pub depth_compute_s: Option<f64>,
}

/// What a short streamed decode of the model at cache 0 measured, per token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeProbe {
    pub tokens: u32,
    /// Time outside flash waits: every layer's compute with the streaming
    /// engine's own costs (graph splits, the cache), which the kernel model
    /// (one product, one segment a layer) puts at half or less on real shapes.
    pub compute_s: f64,
    /// The decode's reads at their own rate (its batches, its queue depth).
    pub read_bytes_per_s: f64,
}

impl HostFacts {
    /// Reads into recycled memory: the decode's own rate when it read.
    fn read_rate(&self) -> f64 {
        match self.decode {
            Some(d) if d.read_bytes_per_s > 0.0 => d.read_bytes_per_s,
            _ => self.read_bytes_per_s,
        }
    }

    /// Reads into fresh memory: the probe's fresh rate, scaled as the recycled
    /// rate was (the probe's ratio of the two is what fresh memory costs).
    fn fresh_rate(&self) -> f64 {
        let scale = self.read_rate() / self.read_bytes_per_s.max(1.0);
        self.fresh_read_bytes_per_s * scale
    }
}

/// What the cache does at one budget: the share of routed slices it finds,
/// and the share of its reads that go to slots never used before.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheOutcome {
    pub hit: f64,
    pub fill_share: f64,
}

/// gpt-oss-20b's public routing through the default policy, learned
/// (docs/cache.md, trace `all`; `bmoe replay gptoss-all.bmrt --cache-mb
/// 10%,25%,50%`): (budget share of the expert bytes, hit share).
pub const PUBLISHED_DEFAULT: [(f64, f64); 5] = [
    (0.0, 0.0),
    (0.10, 0.396),
    (0.25, 0.697),
    (0.50, 0.924),
    (1.0, 1.0),
];

/// A hit share at budget share `f` by straight lines between `points`.
pub fn interpolate(points: &[(f64, f64)], f: f64) -> f64 {
    let f = f.clamp(0.0, 1.0);
    for w in points.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        if f <= x1 {
            return y0 + (y1 - y0) * (f - x0) / (x1 - x0).max(f64::EPSILON);
        }
    }
    points.last().map_or(0.0, |p| p.1)
}

/// One cache setting's forecast.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub label: String,
    pub budget_bytes: u64,
    /// Share of routed slices found cached (0..=1).
    pub hit: f64,
    /// Share of the reads into slots never used before.
    pub fill_share: f64,
    pub read_bytes_per_token: f64,
    /// Reads then compute, one after the other (the default).
    pub serial_tok_s: f64,
    /// The most `--overlap` and read-ahead can reach: the slower of the two.
    pub overlap_bound_tok_s: f64,
}

/// Weight bytes one token's compute reads: the dense weights (the token
/// embedding only where it is also the output matrix) and the routed experts.
pub fn weight_bytes_per_token(l: &MoeLayout) -> u64 {
    let embd = if l.output_is_tied() {
        0
    } else {
        l.tally.embd_bytes
    };
    l.dense_bytes().saturating_sub(embd) + l.routed_bytes_per_token()
}

/// Compute seconds of one token: the compute probe's (resident decodes of
/// the model cut to fewer blocks) when it ran, else the decode probe's, else
/// its weights through the kernel and one graph segment per routed layer.
pub fn compute_s(l: &MoeLayout, host: &HostFacts) -> f64 {
    if let Some(s) = host.depth_compute_s {
        return s;
    }
    host.decode
        .map_or_else(|| kernel_compute_s(l, host), |d| d.compute_s)
}

/// The kernel model of a token's compute (what the decode probe replaces).
pub fn kernel_compute_s(l: &MoeLayout, host: &HostFacts) -> f64 {
    let layers = l.expert_layers().len() as f64;
    weight_bytes_per_token(l) as f64 / host.weight_bytes_per_s.max(1.0) + layers * host.segment_s
}

/// The cache at `budget_bytes` with outcome `o`, on `host`.
pub fn cell(
    label: &str,
    budget_bytes: u64,
    o: CacheOutcome,
    l: &MoeLayout,
    host: &HostFacts,
) -> Cell {
    let compute_s = compute_s(l, host);
    let read = l.routed_bytes_per_token() as f64 * (1.0 - o.hit.clamp(0.0, 1.0));
    let fresh = read * o.fill_share.clamp(0.0, 1.0);
    let read_s = (read - fresh) / host.read_rate().max(1.0) + fresh / host.fresh_rate().max(1.0);
    Cell {
        label: label.to_string(),
        budget_bytes,
        hit: o.hit,
        fill_share: o.fill_share,
        read_bytes_per_token: read,
        serial_tok_s: 1.0 / (compute_s + read_s),
        overlap_bound_tok_s: 1.0 / compute_s.max(read_s),
    }
}

/// What `--cache-mb auto` would take at start-up: MemAvailable less the
/// dense weights, a default context's compute buffers (-c 2048, a 512-token
/// micro-batch) and 512 MiB of headroom, capped by the expert bytes (the
/// run's own rule, `stream::budget`, before a load).
pub fn auto_budget_bytes(l: &MoeLayout, mem_available_bytes: u64) -> u64 {
    let (vocab, heads) = l.ctx.as_ref().map_or((0, 1), |c| (c.n_vocab, c.n_head));
    let compute = compute_estimate_bytes(512, vocab, 2048, heads);
    mem_available_bytes
        .saturating_sub(l.dense_bytes())
        .saturating_sub(compute)
        .saturating_sub(crate::stream::HEADROOM_BYTES)
        .min(l.expert_bytes())
}

/// The forecast table.
pub fn table(cells: &[Cell], l: &MoeLayout, host: &HostFacts, curve: &str) -> String {
    table_with(cells, l, host, curve, None)
}

/// The forecast table, with the compute probe's line when it ran.
pub fn table_with(
    cells: &[Cell],
    l: &MoeLayout,
    host: &HostFacts,
    curve: &str,
    depth: Option<&DepthFit>,
) -> String {
    let mut s = format!(
        "forecast:         reads {:.0} MiB/s (random expert slices, depth 4; {:.0} MiB/s into memory \
         never used before), kernel {:.0} MiB/s of weights and {:.0} us a graph segment -> compute \
         {:.1} ms/token ({:.1} MiB of weights, {} routed layers); MemAvailable {:.0} MiB\n",
        host.read_bytes_per_s / MIB,
        host.fresh_read_bytes_per_s / MIB,
        host.weight_bytes_per_s / MIB,
        host.segment_s * 1e6,
        kernel_compute_s(l, host) * 1e3,
        weight_bytes_per_token(l) as f64 / MIB,
        l.expert_layers().len(),
        host.mem_available_bytes as f64 / MIB
    );
    if let Some(d) = host.decode {
        let uses = if depth.is_some_and(DepthFit::usable) {
            "the cells below use its reads (its compute is the compute probe's)"
        } else {
            "the cells below use these"
        };
        s += &format!(
            "  decode probe:   {} tokens streamed at cache 0: compute {:.1} ms/token outside flash \
             waits, reads {:.0} MiB/s: {uses}\n",
            d.tokens,
            d.compute_s * 1e3,
            d.read_bytes_per_s / MIB
        );
    }
    if let Some(f) = depth {
        s += &f.line();
    }
    s += &format!("  hit rates from: {curve}\n");
    s += "  cache      budget MiB   hit %   read MiB/token   fresh %   tok/s serial   tok/s overlap bound\n";
    for c in cells {
        s += &format!(
            "  {:<10} {:>10.0} {:>7.1} {:>16.2} {:>9.0} {:>14.2} {:>21.2}\n",
            c.label,
            c.budget_bytes as f64 / MIB,
            c.hit * 100.0,
            c.read_bytes_per_token / MIB,
            c.fill_share * 100.0,
            c.serial_tok_s,
            c.overlap_bound_tok_s
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_curve_is_interpolated_and_clamped() {
        assert_eq!(interpolate(&PUBLISHED_DEFAULT, 0.0), 0.0);
        assert!((interpolate(&PUBLISHED_DEFAULT, 0.25) - 0.697).abs() < 1e-12);
        let mid = interpolate(&PUBLISHED_DEFAULT, 0.375);
        assert!((mid - (0.697 + 0.924) / 2.0).abs() < 1e-9, "{mid}");
        assert_eq!(interpolate(&PUBLISHED_DEFAULT, 7.0), 1.0);
    }

    #[test]
    fn a_cell_adds_reads_to_compute_and_the_bound_takes_the_slower() {
        let mut l = crate::layout::two_blocks();
        // Tied: the embedding is the output matrix.
        (l.tally.output_bytes, l.tally.output_matrix) = (4, false);
        let host = HostFacts {
            read_bytes_per_s: 600.0,
            weight_bytes_per_s: 1000.0 * 8.0,
            fresh_read_bytes_per_s: 200.0,
            segment_s: 0.01,
            mem_available_bytes: 0,
            decode: None,
            depth_compute_s: None,
        };
        let none = |hit| CacheOutcome {
            hit,
            fill_share: 0.0,
        };
        // Routed 600 bytes/token; weights: dense 1500 (all of it, tied) + 600.
        assert_eq!(weight_bytes_per_token(&l), 1500 + 600);
        let c = cell("0", 0, none(0.0), &l, &host);
        // Two routed layers: two segments.
        let (compute, read) = (2100.0 / 8000.0 + 0.02, 600.0 / 600.0);
        assert!((c.serial_tok_s - 1.0 / (compute + read)).abs() < 1e-9);
        assert!((c.overlap_bound_tok_s - 1.0 / read).abs() < 1e-9);
        let half = cell("50%", 600, none(0.5), &l, &host);
        assert_eq!(half.read_bytes_per_token, 300.0);
        // Untied: the embedding's 400 bytes are one row a token, not read whole.
        assert_eq!(
            weight_bytes_per_token(&crate::layout::two_blocks()),
            1100 + 600
        );
        assert!(half.serial_tok_s > c.serial_tok_s);
        // A cache still filling reads its misses into fresh memory, slower.
        let filling = cell(
            "auto",
            1200,
            CacheOutcome {
                hit: 0.5,
                fill_share: 1.0,
            },
            &l,
            &host,
        );
        assert!((filling.serial_tok_s - 1.0 / (compute + 300.0 / 200.0)).abs() < 1e-9);
    }

    #[test]
    fn a_decode_probe_replaces_the_kernel_model_and_the_read_probe() {
        let l = crate::layout::two_blocks();
        let mut host = HostFacts {
            read_bytes_per_s: 600.0,
            weight_bytes_per_s: 1e9,
            fresh_read_bytes_per_s: 300.0,
            segment_s: 0.0,
            mem_available_bytes: 0,
            decode: None,
            depth_compute_s: None,
        };
        let o = |fill_share| CacheOutcome {
            hit: 0.0,
            fill_share,
        };
        let before = cell("0", 0, o(0.0), &l, &host);
        host.decode = Some(DecodeProbe {
            tokens: 3,
            compute_s: 0.5,
            read_bytes_per_s: 1200.0,
        });
        assert_eq!(compute_s(&l, &host), 0.5);
        assert!(kernel_compute_s(&l, &host) < 1e-5);
        // Routed 600 bytes/token at the decode's 1200 B/s, then 0.5 s of compute.
        let c = cell("0", 0, o(0.0), &l, &host);
        assert!((c.serial_tok_s - 1.0).abs() < 1e-9, "{c:?}");
        assert!((c.overlap_bound_tok_s - 2.0).abs() < 1e-9, "{c:?}");
        assert!(
            (before.overlap_bound_tok_s - 1.0).abs() < 1e-3,
            "{before:?}"
        );
        // Fresh memory keeps the probe's ratio: half the recycled rate.
        let f = cell("auto", 600, o(1.0), &l, &host);
        assert!((f.serial_tok_s - 1.0 / (0.5 + 1.0)).abs() < 1e-9, "{f:?}");
        let t = table(std::slice::from_ref(&c), &l, &host, "a curve");
        assert!(t.contains("decode probe:   3 tokens"), "{t}");
        assert!(t.contains("compute 500.0 ms/token"), "{t}");
        // The compute probe's full-depth time replaces the decode's compute.
        let fit = DepthFit::of(
            &[
                DepthSample {
                    blocks: 1,
                    tokens: 4,
                    token_s: 0.2,
                },
                DepthSample {
                    blocks: 2,
                    tokens: 4,
                    token_s: 0.3,
                },
            ],
            2,
        )
        .expect("a fit");
        host.depth_compute_s = Some(fit.compute_s());
        assert!((compute_s(&l, &host) - 0.3).abs() < 1e-12);
        let d = cell("0", 0, o(0.0), &l, &host);
        assert!((d.serial_tok_s - 1.0 / (0.3 + 0.5)).abs() < 1e-9, "{d:?}");
        let t = table_with(&[d], &l, &host, "a curve", Some(&fit));
        assert!(t.contains("its compute is the compute probe's"), "{t}");
        assert!(t.contains("compute probe:  resident decodes"), "{t}");
    }

    #[test]
    fn auto_takes_what_is_left_and_stops_at_the_experts() {
        let l = crate::layout::two_blocks();
        assert_eq!(auto_budget_bytes(&l, 0), 0);
        assert_eq!(auto_budget_bytes(&l, 1 << 40), l.expert_bytes());
    }
}
