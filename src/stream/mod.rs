//! Expert streaming, assembled: the flash actor over the model file, the
//! verify-side hook, the expert cache budget, and what happens to llama.cpp's
//! mapping (expert ranges dropped, dense ranges warmed or locked).

mod budget;
mod fault;
mod hook;
pub mod memory;
mod predict;
mod trace;
mod warm;

pub use budget::{compute_estimate_bytes, AutoTerms, HEADROOM_BYTES};
pub use predict::Predictor;
pub use warm::{WarmSession, WarmSource};

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use bmoe_actors::cache::{CachePolicy, Requester};
use bmoe_actors::flash::{
    open_faulty_reader, FaultCounts, FaultPlan, Flash, FlashConfig, FlashError, ShardFile,
    TensorSpec,
};
use bmoe_actors::output::PendingFile;

pub use hook::{DenseAnon, HookOptions, SharedAnon, StreamHook};
use memory::FileMapping;

use crate::layout::MoeLayout;

const MIB: u64 = 1024 * 1024;
/// The largest `--cache-mb` / `--cache-ceil-mb` whose byte count fits a u64.
pub const MAX_CACHE_MB: u64 = u64::MAX / MIB;

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    Flash(#[from] FlashError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--predict-prefetch cannot use this model's routers: {0}")]
    Predict(String),
    #[error(
        "--predict-prefetch cannot guess this model's next-layer routing: {0}; drop \
         --predict-prefetch for this model"
    )]
    PredictUnsupported(String),
    #[error("--route-trace {path}: {reason}", path = path.display())]
    RouteTrace { path: PathBuf, reason: String },
    #[error("--cache-warm {0}")]
    Warm(String),
    #[error("--inject-faults reads one file; this model is split into shards")]
    FaultsOnSplit,
    #[error("cannot find llama.cpp's mapping of {0} in /proc/self/maps")]
    NoMapping(String),
    #[error(
        "{model} has no ffn_{{gate,up,down}}_exps tensors (n_expert {n_expert}): it is a dense model \
         or an MoE layout bmoe does not know; drop --moe-stream (it runs resident)"
    )]
    NotMoe { model: String, n_expert: u32 },
    #[error(
        "{model} declares {n_expert} experts but has no blk.N.ffn_{{gate,up,gate_up,down}}_exps \
         tensors (expert tensors seen: {seen}): an MoE layout bmoe cannot stream (run it with \
         --resident)"
    )]
    UnknownLayout {
        model: String,
        n_expert: u32,
        seen: String,
    },
    #[error(
        "--cache-mb {asked_mb} does not fit: MemAvailable is {available_mb} MiB; with the dense \
         weights ({dense_mb} MiB) and {headroom_mb} MiB of headroom at most {fits_mb} MiB fits \
         (or use --cache-mb auto)"
    )]
    CacheTooLarge {
        asked_mb: u64,
        available_mb: u64,
        dense_mb: u64,
        headroom_mb: u64,
        fits_mb: u64,
    },
    #[error(
        "--dense-weights mlock: locking {need_mb} MiB failed ({source}); RLIMIT_MEMLOCK is {limit}; \
         raise it (ulimit -l) or use --dense-weights warm"
    )]
    Mlock {
        need_mb: u64,
        limit: String,
        #[source]
        source: std::io::Error,
    },
}

/// `--cache-mb`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CacheSize {
    Mib(u64),
    /// A share of the model's expert bytes (`25%`), resolved at load.
    Percent(f64),
    /// What the host can spare once the model and its contexts exist
    /// ([`AutoTerms`]), capped by `--cache-ceil-mb`.
    Auto,
}

impl CacheSize {
    /// The bytes a fixed size asks for out of `expert_bytes` (None for
    /// `auto`, which depends on the host once the model is loaded).
    pub fn asked_bytes(self, expert_bytes: u64) -> Option<u64> {
        match self {
            CacheSize::Mib(mb) => Some(mb.saturating_mul(MIB)),
            CacheSize::Percent(p) => Some((expert_bytes as f64 * p / 100.0) as u64),
            CacheSize::Auto => None,
        }
    }
}

impl std::str::FromStr for CacheSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(CacheSize::Auto);
        }
        if let Some(p) = s.strip_suffix('%') {
            return match p.parse::<f64>() {
                Ok(v) if v.is_finite() && (0.0..=100.0).contains(&v) => Ok(CacheSize::Percent(v)),
                _ => Err(format!(
                    "expected a share of the expert bytes in 0%..=100%, got {s:?}"
                )),
            };
        }
        if let Ok(mb) = s.parse::<u64>() {
            if mb > MAX_CACHE_MB {
                return Err(format!(
                    "{mb} MiB does not fit in 64 bits of bytes (at most {MAX_CACHE_MB})"
                ));
            }
        }
        s.parse::<u64>().map(CacheSize::Mib).map_err(|_| {
            format!("expected a number of MiB, a share like 25% of the expert bytes, or 'auto', got {s:?}")
        })
    }
}

/// `--dense-weights`: what to do with the dense (non-expert) weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DenseMode {
    /// Leave them in llama.cpp's mapping (paged in on use).
    Mmap,
    /// Touch them once after load so they are resident from the first token.
    Warm,
    /// Copy them into anonymous memory (out of the page cache) on first use.
    Anon,
    /// Lock them in memory (needs RLIMIT_MEMLOCK above the dense bytes).
    Mlock,
}

impl DenseMode {
    pub fn name(self) -> &'static str {
        match self {
            DenseMode::Mmap => "mmap",
            DenseMode::Warm => "warm",
            DenseMode::Anon => "anon",
            DenseMode::Mlock => "mlock",
        }
    }
}

/// Streaming settings, as typed.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    pub cache: CacheSize,
    /// Upper bound of `--cache-mb auto` (None: what the host can spare).
    pub cache_ceil_mb: Option<u64>,
    pub io_threads: u32,
    pub o_direct: bool,
    pub dense: DenseMode,
    /// Wait for the down slices only at the activation (reads overlap gate/up compute).
    pub overlap: bool,
    /// Temporal prefetch depth (`--prefetch K`): layers read ahead from the last token's routing.
    pub prefetch: u32,
    /// Predictive prefetch (`--predict-prefetch`): score layer L+1's router at layer L.
    pub predict_prefetch: bool,
    /// `--drop-cold-experts F` (lossy; 0 is off).
    pub drop_cold: f32,
    /// Test-only `--inject-faults`: read through a fault-injecting reader (io_uring or pread).
    pub faults: Option<FaultPlan>,
    /// `--cache-policy`: the cache's eviction order.
    pub policy: CachePolicy,
    /// `--route-trace FILE`: record the verify decodes' routing there.
    pub route_trace: Option<PathBuf>,
    /// `--cache-warm`: start the cache from earlier runs' hottest experts.
    pub warm: WarmSource,
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            cache: CacheSize::Mib(0),
            cache_ceil_mb: None,
            io_threads: 4,
            o_direct: true,
            dense: DenseMode::Warm,
            overlap: false,
            prefetch: 0,
            predict_prefetch: false,
            drop_cold: 0.0,
            faults: None,
            policy: CachePolicy::default(),
            route_trace: None,
            warm: WarmSource::Off,
        }
    }
}

/// The cache budget the engine starts with, in bytes (never more than all
/// experts): `auto` starts at 0 (the working set) until
/// [`Streamer::settle_auto`] decides it, once the contexts exist.
pub fn resolve_cache_bytes(
    cfg: &StreamConfig,
    layout: &MoeLayout,
    available: Option<u64>,
) -> Result<u64, StreamError> {
    let experts = layout.expert_bytes();
    let dense = layout.dense_bytes();
    let fits = available
        .map(|a| a.saturating_sub(dense + HEADROOM_BYTES))
        .unwrap_or(u64::MAX);
    let Some(asked) = cfg.cache.asked_bytes(experts) else {
        return Ok(0);
    };
    if asked.min(experts) > fits {
        return Err(StreamError::CacheTooLarge {
            asked_mb: asked / MIB,
            available_mb: available.unwrap_or(0) / MIB,
            dense_mb: dense / MIB,
            headroom_mb: HEADROOM_BYTES / MIB,
            fits_mb: fits / MIB,
        });
    }
    Ok(asked.min(experts))
}

/// What the read probe reads: the file holding most expert bytes (the only
/// one, or a shard of a split model) and its expert slices as (file offset, bytes).
pub fn probe_slices(layout: &MoeLayout) -> (std::path::PathBuf, Vec<(u64, u64)>) {
    let shard = (0..layout.shards.len())
        .max_by_key(|&i| layout.shard_expert_bytes(i))
        .unwrap_or(0);
    let slices = layout
        .experts
        .iter()
        .filter(|e| e.shard == shard)
        .flat_map(|e| (0..e.n_expert).map(move |x| (e.slice_offset(x), e.slice_bytes)))
        .collect();
    let path = layout.shards.get(shard).map(|s| s.path.clone());
    (path.unwrap_or_default(), slices)
}

/// The model's files as the flash actor reads them.
fn shard_files(layout: &MoeLayout) -> Vec<ShardFile> {
    layout
        .shards
        .iter()
        .map(|s| ShardFile {
            path: s.path.clone(),
            base: s.base,
        })
        .collect()
}

fn specs(layout: &MoeLayout) -> Vec<TensorSpec> {
    layout
        .experts
        .iter()
        .map(|e| TensorSpec {
            layer: e.layer,
            proj: e.proj,
            file_offset: e.stream_offset,
            slice_bytes: e.slice_bytes,
            n_expert: e.n_expert,
        })
        .collect()
}

/// Lock `ranges` of `map` in memory (`--dense-weights mlock`).
fn lock_ranges(map: &FileMapping, ranges: &[(u64, u64)]) -> Result<(), StreamError> {
    let need: u64 = ranges.iter().map(|r| r.1).sum();
    for &(off, len) in ranges {
        map.lock_range(off, len)
            .map_err(|source| StreamError::Mlock {
                need_mb: need.div_ceil(MIB),
                limit: memory::memlock_limit_bytes()
                    .map(|b| format!("{} KiB", b / 1024))
                    .unwrap_or_else(|| "unlimited".into()),
                source,
            })?;
    }
    Ok(())
}

/// A running streamer: the flash actor plus what the verify hook needs.
pub struct Streamer {
    pub flash: Flash,
    pub budget_bytes: u64,
    pub notes: Vec<String>,
    layout: MoeLayout,
    /// Per file of the model: its mappings that existed before llama.cpp loaded it.
    premapped: Vec<Vec<usize>>,
    /// Experts routed per token (after `--n-expert-used`).
    k: u32,
    predictor: Option<Arc<Predictor>>,
    drop_cold: f32,
    /// What `--inject-faults` injected (None without it).
    pub faults: Option<Arc<FaultCounts>>,
    /// `--inject-faults observer_panic_at=N` (0: off).
    observer_panic_at: u64,
    /// `--route-trace`: the writer, until the verify hook takes it, and the
    /// file it writes, until the run's end moves it into place.
    route_trace: Mutex<Option<trace::RouteTraceWriter>>,
    route_trace_file: Mutex<Option<PendingFile>>,
    /// `--cache-warm` (None when off), from [`Streamer::start_warm`].
    warm: Option<WarmSession>,
    model_path: PathBuf,
}

impl Streamer {
    /// Start the flash actor for `layout` of `model_path`.
    pub fn start(
        model_path: &Path,
        layout: &MoeLayout,
        cfg: &StreamConfig,
        k: u32,
    ) -> Result<Self, StreamError> {
        if !layout.is_moe() {
            return Err(StreamError::NotMoe {
                model: model_path.display().to_string(),
                n_expert: layout.n_expert,
            });
        }
        let budget_bytes = resolve_cache_bytes(cfg, layout, memory::mem_available_bytes())?;
        let flash_cfg = FlashConfig {
            budget_bytes,
            queue_depth: cfg.io_threads,
            o_direct: cfg.o_direct,
            prefetch_layers: cfg.prefetch,
            prefetch_max_experts: k,
            policy: cfg.policy,
            ..FlashConfig::default()
        };
        let mut fault_counts = None;
        let flash = match &cfg.faults {
            None => Flash::spawn(&shard_files(layout), specs(layout), flash_cfg)?,
            Some(_) if layout.is_split() => return Err(StreamError::FaultsOnSplit),
            Some(plan) => {
                let max_slice = layout
                    .experts
                    .iter()
                    .map(|e| e.slice_bytes)
                    .max()
                    .unwrap_or(0);
                let f = open_faulty_reader(model_path, plan, cfg.io_threads, max_slice)?;
                fault_counts = Some(f.counts);
                Flash::spawn_with_reader(
                    f.reader,
                    vec![f.note],
                    specs(layout),
                    flash_cfg,
                    &[model_path],
                )?
            }
        };
        let notes = flash.notes().to_vec();
        let (route_trace, route_trace_file) = match &cfg.route_trace {
            Some(p) => {
                let (w, f) = trace::create(p, trace::header(model_path, layout, k))?;
                (Some(w), Some(f))
            }
            None => (None, None),
        };
        let predictor = if cfg.predict_prefetch {
            Some(Arc::new(Predictor::load(model_path, layout, k)?))
        } else {
            None
        };
        Ok(Self {
            flash,
            budget_bytes,
            notes,
            layout: layout.clone(),
            premapped: layout
                .shards
                .iter()
                .map(|s| FileMapping::existing_bases(&s.path))
                .collect(),
            k,
            predictor,
            drop_cold: cfg.drop_cold,
            faults: fault_counts,
            observer_panic_at: cfg.faults.as_ref().map_or(0, |p| p.observer_panic_at),
            route_trace: Mutex::new(route_trace),
            route_trace_file: Mutex::new(route_trace_file),
            warm: None,
            model_path: model_path.to_path_buf(),
        })
    }

    /// `--cache-warm`, once the budget is settled: find the profile and queue
    /// its hottest slots for the flash actor (read while the prompt is
    /// prefilled, after every demand).
    pub fn start_warm(&mut self, cfg: &StreamConfig) -> Result<(), StreamError> {
        if cfg.warm == WarmSource::Off {
            return Ok(());
        }
        let shape = warm::model_shape(&self.layout, self.k)?;
        if let Some((session, plan)) =
            WarmSession::open(&cfg.warm, &self.model_path, shape, self.budget_bytes)?
        {
            let empty = plan.keys.is_empty() && plan.rates.is_empty();
            if !empty && !self.flash.warm(plan.keys, plan.rates) {
                self.notes
                    .push("--cache-warm: the flash actor was busy; nothing read ahead".into());
            }
            self.warm = Some(session);
        }
        Ok(())
    }

    /// `--cache-warm`: the summary line, and the profile saved with this
    /// run's routing (a failed save is said, not fatal). None when off.
    pub fn finish_warm(&self) -> Option<(String, String)> {
        let session = self.warm.as_ref()?;
        let c = self.flash.counters();
        let saved = session
            .save(c)
            .unwrap_or_else(|e| format!("profile not saved: {e}"));
        Some((session.line(c), saved))
    }

    /// Move the `--route-trace` file into place (the verify hook, and with it
    /// the writer, must be gone: every decode it saw is flushed). Returns
    /// where it is; None without `--route-trace`.
    pub fn commit_route_trace(&self) -> Result<Option<PathBuf>, StreamError> {
        let pending = self.route_trace_file.lock().ok().and_then(|mut f| f.take());
        pending.map(trace::commit).transpose()
    }

    /// `--cache-mb auto`, once the model and every context exist: the budget
    /// the host can spare (see [`AutoTerms`]), given the contexts' estimated
    /// compute buffers. Returns how it was resolved (None for a fixed size).
    pub fn settle_auto(&mut self, cfg: &StreamConfig, compute: u64) -> Option<AutoTerms> {
        if cfg.cache != CacheSize::Auto {
            return None;
        }
        let terms = AutoTerms {
            available: memory::mem_available_bytes().unwrap_or(u64::MAX),
            dense: self.layout.dense_bytes(),
            compute,
            headroom: HEADROOM_BYTES,
            ceiling: cfg.cache_ceil_mb.map(|mb| mb.saturating_mul(MIB)),
            experts: self.layout.expert_bytes(),
        };
        self.budget_bytes = terms.bytes();
        self.flash.set_budget(self.budget_bytes);
        Some(terms)
    }

    /// After the model is loaded: drop the expert ranges of llama.cpp's mapping
    /// of each model file (the load populated them) and handle the dense
    /// weights per `dense`.
    pub fn prepare_mapping(&self, dense: DenseMode) -> Result<Option<SharedAnon>, StreamError> {
        let mut address_ranges = Vec::new();
        for (i, shard) in self.layout.shards.iter().enumerate() {
            let map = FileMapping::find(&shard.path, &self.premapped[i])?;
            for e in self.layout.experts.iter().filter(|e| e.shard == i) {
                map.drop_range(e.file_offset, e.bytes());
            }
            let dense_ranges = self.dense_ranges(i);
            match dense {
                DenseMode::Mmap => {}
                DenseMode::Anon => address_ranges.extend(map.address_ranges()),
                DenseMode::Warm => {
                    for (off, len) in &dense_ranges {
                        map.warm_range(*off, *len);
                    }
                }
                DenseMode::Mlock => lock_ranges(&map, &dense_ranges)?,
            }
        }
        Ok((dense == DenseMode::Anon)
            .then(|| Arc::new(std::sync::Mutex::new(DenseAnon::new(address_ranges)))))
    }

    /// Ranges of file `shard` that are not expert tensors (header and dense weights).
    fn dense_ranges(&self, shard: usize) -> Vec<(u64, u64)> {
        let mut ex: Vec<(u64, u64)> = self
            .layout
            .experts
            .iter()
            .filter(|e| e.shard == shard)
            .map(|e| (e.file_offset, e.file_offset + e.bytes()))
            .collect();
        ex.sort_unstable();
        let mut out = Vec::new();
        let mut pos = 0;
        for (a, b) in ex {
            if a > pos {
                out.push((pos, a - pos));
            }
            pos = pos.max(b);
        }
        let file_bytes = self.layout.shards[shard].file_bytes;
        if file_bytes > pos {
            out.push((pos, file_bytes - pos));
        }
        out
    }

    /// The verify context's observer: its hook (see [`Self::verify_hook`]),
    /// under the injected observer fault when one is asked for.
    pub fn verify_observer(
        &self,
        abort: Arc<AtomicBool>,
        anon: Option<SharedAnon>,
        overlap: bool,
    ) -> Box<dyn crate::llama::EvalObserver> {
        let hook = self.verify_hook(abort, anon, overlap);
        fault::PanicAt::wrap(Box::new(hook), self.observer_panic_at)
    }

    /// A hook for the verify context, demanding as the verify requester.
    fn verify_hook(
        &self,
        abort: Arc<AtomicBool>,
        anon: Option<SharedAnon>,
        overlap: bool,
    ) -> StreamHook {
        let opts = HookOptions {
            k: self.k,
            overlap,
            counters: Some(self.flash.counters().clone()),
            predictor: self.predictor.clone(),
            drop_cold: self.drop_cold,
            route_log: false,
            anon,
            route_trace: self.route_trace.lock().ok().and_then(|mut w| w.take()),
        };
        StreamHook::new(
            self.flash.client(Requester::Verify),
            self.flash.arena().clone(),
            &self.layout,
            opts,
            abort,
        )
    }

    /// What the MTP draft context's hook is built from, to be assembled on the
    /// draft actor's thread (a hook is not `Send`): the head's expert slices (its
    /// block is layer n_layer, routed at `ffn_moe_topk-{n_layer}`) are demanded
    /// from the same flash actor as the draft requester, with their own pins and
    /// byte counter (the flash split); without it they would be paged in
    /// silently through the file mapping. `anon` is the verify hook's store of
    /// dense copies (`--dense-weights anon`), shared so the head's own dense
    /// weights leave the mapping too. Serial: no overlap, prediction or drops;
    /// it logs its routing for the actor's pre-demand, made with a second
    /// client of the same requester.
    pub fn draft_hook_parts(&self, anon: Option<SharedAnon>) -> DraftHookParts {
        DraftHookParts {
            client: self.flash.client(Requester::Draft),
            predemand: self.flash.client(Requester::Draft),
            arena: self.flash.arena().clone(),
            layout: self.layout.clone(),
            k: self.k,
            anon,
        }
    }
}

/// The ingredients of the MTP draft context's hook, sent to the draft actor's
/// thread and assembled there ([`DraftHookParts::build`]).
pub struct DraftHookParts {
    client: bmoe_actors::flash::FlashClient,
    /// The draft actor's own client (same requester, so its pins hand over to
    /// the hook's next demand): the pre-demand during the verify decode.
    predemand: bmoe_actors::flash::FlashClient,
    arena: Arc<bmoe_actors::flash::Arena>,
    layout: MoeLayout,
    k: u32,
    anon: Option<SharedAnon>,
}

impl DraftHookParts {
    /// The hook and the pre-demand client, on the thread that will run the context.
    pub fn build(self, abort: Arc<AtomicBool>) -> (StreamHook, bmoe_actors::flash::FlashClient) {
        let opts = HookOptions {
            k: self.k,
            route_log: true,
            anon: self.anon,
            ..HookOptions::default()
        };
        let hook = StreamHook::new(self.client, self.arena, &self.layout, opts, abort);
        (hook, self.predemand)
    }
}
