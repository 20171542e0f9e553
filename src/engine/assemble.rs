//! Assembly of a run: the backend (resident, or the streamer and its settings),
//! the model, the target context with its observer, and the MTP actor's config;
//! [`assemble`] puts them together for `bmoe run` and a session alike.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::config::{RunConfig, MTP_UBATCH};
use super::error::EngineError;
use super::mode::{Asked, Mode};
use super::note::Note;
use super::prefill::TARGET_UBATCH;
use super::prefill::{choose_ubatch, PrefillFacts};
use super::refusal::Refusal;
use super::startup::Startup;
use crate::chat::ChatTemplate;
use crate::draft::MtpActorConfig;
use crate::generate;
use crate::layout::MoeLayout;
use crate::llama::{Context, ContextParams, LlamaError, Model, ModelParams, Token};
use crate::stream::route_from::{self, ForcedRoutes, RouteCursor};
use crate::stream::{
    compute_estimate_bytes, memory, ForcedRouting, SharedAnon, StreamConfig, StreamError, Streamer,
};

/// What the prompt's micro-batch is chosen for.
pub(super) enum Prompt<'a> {
    /// `bmoe run`'s prompt, tokenized once the model is loaded.
    Text { text: &'a str, chat: bool },
    /// chat and serve: the longest prompt the context takes.
    Longest,
}

/// The model loaded as configured, its target context with the verify hook,
/// and what loading decided: what `bmoe run` and a session start from.
/// Fields drop in order: the context (and the verify hook with it) before the
/// model and the streamer.
pub(super) struct Assembly {
    pub(super) ctx: Context,
    pub(super) loaded: Loaded,
}

/// Everything of an [`Assembly`] but the target context (which a generation
/// lends to the MTP head while these are in use).
pub(super) struct Loaded {
    pub(super) model: Arc<Model>,
    pub(super) backend: Backend,
    pub(super) layout: MoeLayout,
    /// The configuration for this model ([`RunConfig::for_model`]).
    pub(super) cfg: RunConfig,
    /// Experts routed per token.
    pub(super) k: u32,
    /// What loading decided (a dense model runs resident, the context's
    /// rounding, the cache size), for the summary.
    pub(super) notes: Vec<Note>,
    /// The prompt's tokens (none for [`Prompt::Longest`]).
    pub(super) tokens: Vec<Token>,
    pub(super) prefill: PrefillFacts,
    /// The target context's positions per sequence, and over all sequences.
    pub(super) n_ctx: u32,
    pub(super) kv_positions: u32,
    /// The target context's abort flag (the verify hook raises it).
    pub(super) abort: Arc<AtomicBool>,
    /// The verify hook's dense copies, for the MTP head to share.
    pub(super) anon: Option<SharedAnon>,
    /// When the model began loading, and the process's storage reads then.
    pub(super) load_start: (Instant, Option<u64>),
    /// `--rpc`: the stall watchdog (stops when dropped).
    pub(super) _watchdog: Option<crate::llama::rpc::watchdog::Watchdog>,
}

/// Check `cfg` against the model's layout, start the backend, load the model
/// and create the target context of `n_seq` sequences with its hook; finish
/// with [`Loaded::settle`] once every other context exists.
pub(super) fn assemble(
    cfg: &RunConfig,
    prompt: Prompt<'_>,
    n_seq: u32,
) -> Result<Assembly, EngineError> {
    let mut layout = MoeLayout::open(&cfg.model)?;
    let cfg = cfg.for_model(&layout);
    let (mut mode, mut notes) = cfg.check_against(&layout)?;
    check_context(&cfg, &layout, n_seq)?;
    let rpc = super::rpc::attach(&cfg, &mut layout, &mut notes)?;
    if rpc.is_some() && !layout.is_moe() && mode.stream().is_some() {
        notes.push(Note::AllLayersRemote);
        mode = Asked::Resident;
    }
    let mode = super::fits::choose(&cfg, &layout, n_seq, mode);
    let k = cfg.experts_used(&layout);
    let force = forced_routes(&cfg, &layout, k, &mut notes)?;
    let backend = Backend::start(&cfg, &layout, mode, k)?;
    let load_start = (Instant::now(), memory::io_read_bytes());
    let watchdog = match &rpc {
        Some(r) => Some(start_watchdog(&cfg, r)?),
        None => None,
    };
    // The load sends the hosts their layers: the watchdog watches it too.
    let waiting = rpc.as_ref().map(|r| r.waiting.clone());
    waiting
        .iter()
        .for_each(|w| w.store(true, Ordering::Relaxed));
    let model = load_model(&cfg, &layout, &backend, rpc.as_ref());
    waiting
        .iter()
        .for_each(|w| w.store(false, Ordering::Relaxed));
    let model = model?;
    let (tokens, longest) = match prompt {
        Prompt::Text { text, chat } => {
            let template = chat.then(|| ChatTemplate::of(&model, cfg.chat_template.as_deref()));
            let tokens = generate::prompt_tokens(&model, text, template.as_ref())?;
            let n = tokens.len();
            (tokens, n)
        }
        Prompt::Longest => (Vec::new(), cfg.n_ctx as usize),
    };
    let prefill = prefill_facts(&cfg, &model, &layout, &backend, longest);
    let abort = Arc::new(AtomicBool::new(false));
    let shape = Batching {
        ubatch: prefill.ubatch,
        n_seq,
    };
    let remote = rpc.as_ref().map(|r| RemoteBlocks {
        first_block: r.share.first_block,
        peers: r.hosts.peers.clone(),
        waiting: r.waiting.clone(),
    });
    let watch = Watchers { remote, force };
    let (ctx, anon) = target_context(&cfg, &model, &backend, &abort, shape, &mut notes, watch)?;
    let loaded = Loaded {
        model,
        backend,
        layout,
        cfg,
        k,
        notes,
        tokens,
        prefill,
        n_ctx: ctx.n_ctx(),
        kv_positions: ctx.n_ctx().saturating_mul(ctx.n_seq()),
        abort,
        anon,
        load_start,
        _watchdog: watchdog,
    };
    Ok(Assembly { ctx, loaded })
}

impl Loaded {
    /// The MTP draft actor's configuration for `--mtp` (None otherwise). The
    /// head's experts stream too (requester Draft), and its dense weights
    /// share the verify hook's anonymous copies.
    pub(super) fn mtp_config(&mut self) -> Option<MtpActorConfig> {
        let (p_min, predemand) = self.cfg.speculation.source.head()?;
        let anon = self.anon.take();
        Some(MtpActorConfig {
            model: self.model.clone(),
            n_ctx: self.cfg.n_ctx,
            n_threads: self.cfg.threads,
            n_ubatch: MTP_UBATCH,
            n_batch: self.prefill.ubatch,
            draft_max: self.cfg.speculation.draft_max as usize,
            p_min,
            hook: self.backend.streamer().map(|s| s.draft_hook_parts(anon)),
            predemand,
        })
    }

    /// What loading took since the model began to load (call once every
    /// context exists and the cache is settled).
    pub(super) fn startup(&self) -> Startup {
        let (t_load, io_load) = self.load_start;
        Startup {
            load: t_load.elapsed(),
            load_read_bytes: io_load
                .zip(memory::io_read_bytes())
                .map(|(a, b)| b.saturating_sub(a)),
            before_prefill: std::time::Duration::ZERO,
            unpopulated: self.backend.streamer().is_some(),
        }
    }

    /// `--cache-mb auto` settled once every context exists (with the MTP
    /// head's compute when `mtp`), then `--cache-warm` started.
    pub(super) fn settle(&mut self, mtp: bool) -> Result<(), StreamError> {
        let (kv, ubatch) = (self.kv_positions, self.prefill.ubatch);
        let note = self.backend.settle_auto(&self.model, kv, ubatch, mtp);
        self.notes.extend(note);
        self.backend.start_warm()
    }
}

/// How the experts reach the matmuls, owning what that needs: resident
/// (llama.cpp's own mmap path), or the flash actor and the verify hook with
/// the settings they run under.
pub(super) type Backend = Mode<Streaming>;

/// A streamed run's streamer and its settings.
pub(super) struct Streaming {
    pub(super) streamer: Box<Streamer>,
    pub(super) cfg: StreamConfig,
}

impl Backend {
    /// Start the streamer for a streamed mode (the flash actor runs from here on).
    pub(super) fn start(
        cfg: &RunConfig,
        layout: &MoeLayout,
        mode: Mode,
        k: u32,
    ) -> Result<Self, StreamError> {
        Ok(match mode {
            Mode::Resident => Mode::Resident,
            Mode::Stream(sc) => Mode::Stream(Streaming {
                streamer: Box::new(Streamer::start(&cfg.model, layout, &sc, k)?),
                cfg: sc,
            }),
        })
    }

    pub(super) fn streamer(&self) -> Option<&Streamer> {
        self.stream().map(|s| s.streamer.as_ref())
    }

    /// `--cache-mb auto` once every context exists (see
    /// [`Streamer::settle_auto`]): how it was resolved, for the summary.
    pub(super) fn settle_auto(
        &mut self,
        model: &Model,
        n_ctx: u32,
        ubatch: u32,
        mtp: bool,
    ) -> Option<Note> {
        let Mode::Stream(Streaming { streamer, cfg }) = self else {
            return None;
        };
        let mut compute = compute_bytes(model, n_ctx, ubatch);
        if mtp {
            compute += compute_bytes(model, n_ctx, MTP_UBATCH);
        }
        streamer.settle_auto(cfg, compute).map(Note::CacheAuto)
    }

    /// `--cache-warm`, once the budget is settled (see [`Streamer::start_warm`]).
    pub(super) fn start_warm(&mut self) -> Result<(), crate::stream::StreamError> {
        match self {
            Mode::Resident => Ok(()),
            Mode::Stream(Streaming { streamer, cfg }) => streamer.start_warm(cfg),
        }
    }

    /// `--drop-cold-experts` (0 when off or resident).
    pub(super) fn drop_cold(&self) -> f32 {
        self.stream().map_or(0.0, |s| s.cfg.drop_cold)
    }
}

/// The `--rpc` stall watchdog over the hosts of `r`.
fn start_watchdog(
    cfg: &RunConfig,
    r: &super::rpc::RpcRun,
) -> Result<crate::llama::rpc::watchdog::Watchdog, LlamaError> {
    let timeout = cfg
        .rpc
        .as_ref()
        .map_or(super::rpc_config::DEFAULT_RPC_TIMEOUT, |c| c.timeout);
    let peers = r.hosts.peers.clone();
    Ok(crate::llama::rpc::watchdog::Watchdog::start(
        r.waiting.clone(),
        peers,
        timeout,
    )?)
}

/// The model, mapped by llama.cpp (with its MTP head for `--mtp`, and the
/// routed-expert count overridden for `--n-expert-used`).
pub(super) fn load_model(
    cfg: &RunConfig,
    layout: &MoeLayout,
    backend: &Backend,
    rpc: Option<&super::rpc::RpcRun>,
) -> Result<Arc<Model>, LlamaError> {
    let int_overrides = match cfg.n_expert_used {
        Some(k) => vec![(format!("{}.expert_used_count", layout.arch), k as i64)],
        None => Vec::new(),
    };
    // Streamed: llama.cpp maps the files without reading them in; the dense
    // ranges are read when the mapping is prepared (the experts never are).
    let unpopulated = match backend.streamer() {
        Some(_) => layout.shards.iter().map(|s| s.path.clone()).collect(),
        None => Vec::new(),
    };
    let params = ModelParams {
        use_mmap: true,
        load_mtp: cfg.speculation.source.head().is_some(),
        int_overrides,
        unpopulated,
        vocab_only: false,
        rpc: rpc.map(|r| crate::llama::RpcPlacement {
            devices: r.hosts.devices.clone(),
            layers: r.share.blocks,
        }),
    };
    Ok(Arc::new(Model::load(&cfg.model, &params)?))
}

/// The target context's batching: the prompt's micro-batch, and the KV
/// sequences side by side (`serve --parallel`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Batching {
    pub(super) ubatch: u32,
    pub(super) n_seq: u32,
}

/// The blocks handed to `--rpc` hosts, for the clock of each decode's remote
/// part: the first remote block, the hosts' sockets, and the flag the stall
/// watchdog reads while a decode waits on them.
pub(super) struct RemoteBlocks {
    pub(super) first_block: u32,
    pub(super) peers: Vec<std::net::SocketAddr>,
    pub(super) waiting: Arc<AtomicBool>,
}

/// What the target context's observer watches besides streaming: the RPC
/// hosts' blocks, and `--route-from`'s routing to force.
pub(super) struct Watchers {
    pub(super) remote: Option<RemoteBlocks>,
    pub(super) force: Option<Arc<ForcedRoutes>>,
}

/// `--route-from`: the trace read and checked against this run's shape (a
/// refusal when it does not fit), and the note that the text is meaningless.
fn forced_routes(
    cfg: &RunConfig,
    layout: &MoeLayout,
    k: u32,
    notes: &mut Vec<Note>,
) -> Result<Option<Arc<ForcedRoutes>>, EngineError> {
    let Some(path) = &cfg.route_from else {
        return Ok(None);
    };
    let own = crate::stream::route_trace_header(&cfg.model, layout, k);
    let routes = route_from::load(path, &cfg.model, &own).map_err(Refusal::from)?;
    notes.push(Note::RouteFrom {
        path: path.clone(),
        tokens: routes.tokens(),
        predicted: cfg.mode.stream().is_some_and(|s| s.predict_prefetch),
    });
    Ok(Some(Arc::new(routes)))
}

/// The target context, its observer the verify hook when streaming (the expert
/// ranges of the mapping are dropped first; resident, the forcing of
/// `--route-from` alone), and the hook's dense copies for the MTP head to share.
pub(super) fn target_context(
    cfg: &RunConfig,
    model: &Arc<Model>,
    backend: &Backend,
    abort: &Arc<AtomicBool>,
    shape: Batching,
    notes: &mut Vec<Note>,
    watch: Watchers,
) -> Result<(Context, Option<SharedAnon>), EngineError> {
    let Watchers { remote, force } = watch;
    let force = force.map(RouteCursor::new);
    let Batching { ubatch, n_seq } = shape;
    let speculating = cfg.speculation.is_on();
    let mut params = ContextParams {
        n_ctx: cfg.n_ctx,
        n_batch: ubatch,
        n_ubatch: ubatch,
        n_threads: cfg.threads,
        // Recurrent-state snapshots so a hybrid model can roll back rejected
        // drafts (clamped to 0 by llama.cpp on archs that need none).
        n_rs_seq: if speculating {
            cfg.speculation.draft_max
        } else {
            0
        },
        n_seq,
        abort: Some(abort.clone()),
        ..ContextParams::default()
    };
    let mut anon = None;
    match backend {
        Mode::Stream(Streaming { streamer, cfg: sc }) => {
            anon = streamer.prepare_mapping(sc.dense)?;
            notes.extend(streamer.notes.iter().cloned().map(Note::Stream));
            let observer = streamer.verify_observer(abort.clone(), anon.clone(), sc.overlap, force);
            params.observer = Some(observer);
        }
        Mode::Resident => {
            params.observer = force.map(|c| {
                let forcing = ForcedRouting::new(c, abort.clone());
                Box::new(forcing) as Box<dyn crate::llama::EvalObserver>
            });
        }
    }
    if let Some(r) = remote {
        let inner = params.observer.take();
        let clock = super::rpc::RemoteClock::new(inner, r.first_block, r.peers, r.waiting);
        params.observer = Some(Box::new(clock));
    }
    let ctx = Context::new(model.clone(), params)?;
    if ctx.n_ctx() != cfg.n_ctx {
        notes.push(Note::ContextRounded {
            n_ctx: ctx.n_ctx(),
            asked: cfg.n_ctx,
        });
    }
    Ok((ctx, anon))
}

/// One context's compute buffers on `model` (see [`compute_estimate_bytes`]).
fn compute_bytes(model: &Model, n_ctx: u32, ubatch: u32) -> u64 {
    let (vocab, heads) = (model.n_vocab() as u64, u64::from(model.n_head()));
    compute_estimate_bytes(u64::from(ubatch), vocab, u64::from(n_ctx), heads)
}

/// The prompt's micro-batch (`--ubatch`; auto: the fewest micro-batches whose
/// compute buffers stay within an eighth of MemAvailable, or those of a
/// [`TARGET_UBATCH`] one) and the prefill's allowance over the cache. The
/// same rule runs resident, so both modes compute the prompt alike.
pub(super) fn prefill_facts(
    cfg: &RunConfig,
    model: &Model,
    layout: &MoeLayout,
    backend: &Backend,
    prompt_tokens: usize,
) -> PrefillFacts {
    let compute = |u: u32| compute_bytes(model, cfg.n_ctx, u);
    let base = compute(TARGET_UBATCH);
    let spare = memory::mem_available_bytes().unwrap_or(0) / 8;
    let ubatch = choose_ubatch(cfg.ubatch, prompt_tokens, cfg.n_ctx, |u| {
        compute(u) <= base.max(spare)
    });
    let streamed = backend.streamer().is_some();
    let largest_layer = (0..layout.n_layer + layout.n_layer_nextn)
        .map(|l| layout.layer_expert_bytes(l) * u64::from(layout.n_expert))
        .max()
        .unwrap_or(0);
    PrefillFacts {
        ubatch,
        streamed,
        readahead_allowance_bytes: if streamed { largest_layer } else { 0 },
        compute_extra_bytes: compute(ubatch).saturating_sub(base),
    }
}

/// The context `-c`, `--parallel` and `--ubatch` ask for, checked against the
/// training context and MemAvailable before anything is allocated.
fn check_context(cfg: &RunConfig, layout: &MoeLayout, n_seq: u32) -> Result<(), EngineError> {
    let ubatch = match cfg.ubatch {
        super::prefill::Ubatch::Fixed(u) => u,
        super::prefill::Ubatch::Auto => TARGET_UBATCH,
    };
    let ask = super::ctx_check::CtxAsk {
        n_ctx: u64::from(cfg.n_ctx),
        n_seq: u64::from(n_seq),
        ubatch: u64::from(ubatch),
        draft_ubatch: cfg.speculation.source.head().map(|_| u64::from(MTP_UBATCH)),
    };
    super::ctx_check::check_model(layout.ctx.as_ref(), ask).map_err(|e| Refusal::from(e).into())
}
