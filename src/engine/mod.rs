//! Engine assembly for `bmoe run`: resident (plain llama.cpp mmap) or streamed
//! (flash actor + verify hook), greedy generation, per-token accounting.

use std::time::{Duration, Instant};

use crate::draft::{DraftError, HeadReport, MtpActor};
use crate::generate::{self, GenerateError, Generation};
use crate::layout::MoeLayout;
use crate::llama::{LlamaError, Target};
use crate::stream::{memory, StreamError};
use bmoe_decode::metrics::PredictorTally;
use bmoe_decode::telemetry::{self, Row, Telemetry, TelemetryError};

mod assemble;
mod config;
mod ctx_check;
mod finish;
pub mod fits;
pub mod graph_check;
mod mode;
mod note;
mod prefill;
pub mod prompt_state;
mod report;
mod rpc;
mod rpc_summary;
mod session;
mod sink;
mod startup;
mod summary;
use assemble::{Loaded, Prompt};
use config::preamble;
pub use config::{
    RunConfig, SpecConfig, Speculation, DEFAULT_DRAFT, DEFAULT_N_CTX, DEFAULT_N_PREDICT, MAX_DRAFT,
    MTP_UBATCH, TARGET_UBATCH,
};
pub use mode::Mode;
pub use note::{Note, RpcSplit};
pub use prefill::{choose_ubatch, PrefillReport, Ubatch, UBATCH_MAX};
pub use report::DecodeSplit;
pub use rpc::{RpcConfig, RpcLayers, DEFAULT_RPC_TIMEOUT};
pub use session::{Session, Turn, TurnFigures};
use sink::Sink;
pub(crate) use startup::Startup;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Llama(#[from] LlamaError),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Draft(#[from] DraftError),
    #[error("streaming stopped the decode: {0}")]
    Streaming(String),
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    #[error(transparent)]
    PromptCache(#[from] crate::prompt_cache::PromptCacheError),
    #[error("{0}")]
    Config(String),
    #[error(
        "the model computed NaN for the next token's scores: tensor data is likely corrupt, in \
         the model file here or in what the RPC hosts {0} hold; restart their `bmoe rpc-server` \
         (with --cache it checks its files at start and removes damaged ones), and check the \
         model file against its published checksum"
    )]
    NanWithRpc(String),
    /// A run that failed after generation started: the cause, and the
    /// `BMOE_DONE` object of what was generated (aborted=1), so the binary can
    /// still print it.
    #[error("{cause}")]
    Failed {
        cause: Box<EngineError>,
        done_line: String,
    },
}

impl EngineError {
    /// A refusal: the configuration cannot run and other arguments would fix
    /// it (a prompt longer than the context, streaming a dense model, a cache
    /// that does not fit, a flag the model cannot honour, a damaged warm
    /// profile, an unwritable `--csv`, a bad combination of settings). Every
    /// command that runs the engine exits with the usage code for these.
    pub fn is_refusal(&self) -> bool {
        match self {
            EngineError::Config(_)
            | EngineError::Generate(GenerateError::PromptTooLong { .. })
            | EngineError::Generate(GenerateError::EmptyPrompt)
            | EngineError::Stream(
                StreamError::NotMoe { .. }
                | StreamError::UnknownLayout { .. }
                | StreamError::CacheTooLarge { .. }
                | StreamError::PredictUnsupported(_)
                | StreamError::Warm(_),
            )
            | EngineError::Telemetry(TelemetryError::Csv { .. }) => true,
            EngineError::Failed { cause, .. } => cause.is_refusal(),
            EngineError::Generate(GenerateError::Template(t)) => t.is_bad_input(),
            _ => false,
        }
    }
}

/// Per-token accounting (row i is the decode that produced token i; row 0 the
/// prefill; under a multi-token decode its whole cost sits on its first row).
pub(crate) type TokenRow = Row;

/// What a run produced and measured.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub generation: Generation,
    /// From the first token to the last (see [`decode_rate`]).
    pub(crate) decode_span: Duration,
    /// The draft source and width (`Off` and 0 without speculation).
    pub(crate) speculation: SpecConfig,
    /// Streamed bytes read for the MTP head's passes and for the verify decodes.
    pub(crate) head_read_bytes: u64,
    pub(crate) verify_read_bytes: u64,
    /// The MTP head's streaming on the draft actor (zeros otherwise).
    pub(crate) head: HeadReport,
    pub rows: Vec<TokenRow>,
    /// Where the experts came from: llama.cpp's mapping (`--resident`, or a
    /// dense model) or the flash actor.
    pub mode: Mode<()>,
    pub notes: Vec<Note>,
    pub cache_budget_bytes: u64,
    pub(crate) reader: String,
    /// Flash actor's total bytes over the whole run (prefill included).
    pub flash_read_bytes: u64,
    /// Kernel-reported storage reads of the process over the generation.
    pub(crate) kernel_read_bytes: Option<u64>,
    pub(crate) peak_resident_bytes: u64,
    pub(crate) peak_rss_bytes: u64,
    /// Read-ahead: settings and the flash actor's verdicts.
    pub prefetch: PrefetchReport,
    /// `--cache-warm`: what was read ahead and used, and the profile saved.
    pub(crate) warm_lines: Vec<String>,
    /// Experts routed per token (after `--n-expert-used`) and the model's own count.
    pub(crate) experts_used: u32,
    pub(crate) experts_used_model: u32,
    /// `--drop-cold-experts` threshold (0: off).
    pub(crate) drop_cold: f32,
    pub(crate) dense_bytes: u64,
    pub layout: MoeLayout,
    /// The `BMOE_DONE` JSON object (the same totals as the CSV trailer).
    pub done_line: String,
    /// The load and the time to the first token.
    pub(crate) startup: Startup,
    /// The prompt's pass: its micro-batch, time and (streamed) reads.
    pub prefill: PrefillReport,
}

/// What prefetching did over a run.
#[derive(Debug, Clone, Default)]
pub struct PrefetchReport {
    /// `--prefetch K` (temporal depth) and `--predict-prefetch`.
    pub(crate) layers: u32,
    pub(crate) predictive: bool,
    /// Bytes read ahead (all of them, including any after the last decode).
    pub read_bytes: u64,
    pub useful_bytes: u64,
    pub wasted_bytes: u64,
    pub(crate) hints_dropped: u64,
    pub(crate) errors: u64,
    /// Predictive: experts guessed and how many the real routing used, per layer.
    pub predicted: PredictorTally,
}

impl PrefetchReport {
    pub(crate) fn enabled(&self) -> bool {
        self.layers > 0 || self.predictive
    }
}

/// Run one greedy generation as configured; `on_text` gets the text as it is produced.
pub fn run(cfg: &RunConfig, on_text: impl FnMut(&str)) -> Result<RunReport, EngineError> {
    // Refuse an unwritable --csv before any real work.
    let csv_file = cfg
        .telemetry
        .csv
        .as_deref()
        .map(telemetry::open_csv)
        .transpose()?;
    let t_run = Instant::now();
    let text = Prompt::Text {
        text: &cfg.prompt,
        chat: cfg.chat,
    };
    let mut a = assemble::assemble(cfg, text, 1)?;
    let pcache = prompt_file(cfg, a.loaded.n_ctx);
    let cached = pcache.as_ref().map_or(0, |(f, id)| {
        prompt_state::restore(&mut a.ctx, f, id, &a.loaded.tokens)
    });
    let loaded = &mut a.loaded;
    let mut target = Target::new(&mut a.ctx);
    let started = Started {
        csv_file,
        t_run,
        cached,
    };
    let (telemetry, metered, head, startup) =
        std::thread::scope(|scope| generate_scoped(scope, loaded, &mut target, started, on_text))?;
    if let Some((f, id)) = pcache.filter(|_| metered.res.is_ok()) {
        prompt_state::save(&mut a.ctx, &f, &id, &a.loaded.tokens);
    }
    let ended = finish::Ended {
        metered,
        head,
        observer_failure: a.ctx.observer_failure(),
        aborted_by_hook: a.loaded.abort.load(std::sync::atomic::Ordering::SeqCst),
        startup,
    };
    finish::report(a, telemetry, ended)
}

/// What the run opened before assembling: the CSV, and when it started.
struct Started {
    csv_file: Option<telemetry::CsvOut>,
    t_run: Instant,
    /// Prompt tokens restored from `--prompt-cache-file`.
    cached: usize,
}

/// `--prompt-cache-file FILE` and what names its state (None: not given, or the
/// model unreadable, said; or speculation on, whose drafts need a cold prompt).
fn prompt_file(
    cfg: &RunConfig,
    n_ctx: u32,
) -> Option<(std::path::PathBuf, crate::prompt_cache::Ident)> {
    let file = cfg.prompt_cache.clone()?;
    if cfg.speculation.is_on() {
        crate::say!(
            "note: --prompt-cache-file is not used with speculation (--ngram, --mtp, --spec)"
        );
        return None;
    }
    // run's context holds one sequence: its states are of one KV stream.
    match prompt_state::ident_of(cfg, n_ctx, 1) {
        Ok(id) => Some((file, id)),
        Err(e) => {
            crate::say!(
                "warning: --prompt-cache-file: cannot read {}: {e}",
                cfg.model.display()
            );
            None
        }
    }
}

/// From the assembled model to the generation's end, with the MTP draft actor
/// (for `--mtp`) on a thread of `scope`, lent `target` for each of its calls
/// and joined before this returns: the draft context, the cache settled, the
/// CSV preamble and telemetry, then the generation.
fn generate_scoped<'scope, 't: 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    loaded: &mut Loaded,
    target: &mut Target<'t>,
    started: Started,
    on_text: impl FnMut(&str),
) -> Result<(Telemetry, Metered, HeadReport, Startup), EngineError> {
    let mut mtp = match loaded.mtp_config() {
        Some(actor_cfg) => Some(MtpActor::spawn(scope, target, actor_cfg)?),
        None => None,
    };
    loaded.settle(mtp.is_some())?;
    let reader = loaded.backend.streamer().map(config::ReaderFacts::of);
    let mut startup = loaded.startup();
    let shape = config::ContextFacts {
        n_layer: loaded.model.n_layer(),
        n_ctx: loaded.n_ctx,
        n_ubatch: loaded.prefill.ubatch,
    };
    let mut preamble = preamble(&loaded.cfg, &loaded.layout, reader.as_ref(), shape);
    preamble.extend(startup.load_pairs());
    let telemetry = Telemetry::start(&loaded.cfg.telemetry, started.csv_file, &preamble)?;
    startup.before_prefill = started.t_run.elapsed();
    let prompt = PromptBatches {
        tokens: &loaded.tokens[..],
        ubatch: loaded.prefill.ubatch,
        cached: started.cached,
    };
    let metered = generate_metered(
        &loaded.cfg,
        target,
        prompt,
        &telemetry,
        on_text,
        mtp.as_mut(),
    );
    // Join the draft actor before anything else reads the target context.
    let head = mtp.as_mut().map(|a| a.finish()).unwrap_or_default();
    Ok((telemetry, metered, head, startup))
}

/// The run's draft sources: the matcher, the head, or both (`--spec auto`
/// on a model with a head).
fn gated_sources<'d, 't>(
    ngram: Option<&'d mut generate::NgramDrafter>,
    head: Option<&'d mut MtpActor<'_, 't>>,
) -> Option<generate::Sources<'d, 't>> {
    use bmoe_decode::spec_gate::Source;
    match (ngram, head) {
        (Some(ngram), Some(head)) => Some(generate::Sources::Auto { ngram, head }),
        (Some(d), None) => Some(generate::Sources::One(d, Source::Ngram)),
        (None, Some(d)) => Some(generate::Sources::One(d, Source::Mtp)),
        (None, None) => None,
    }
}

/// What the generation produced and measured, before the run's totals.
pub(super) struct Metered {
    res: Result<Generation, GenerateError>,
    rows: Vec<TokenRow>,
    /// From the first token to the last kept one (see [`decode_rate`]).
    decode_span: Duration,
    /// Predictive prefetch: experts guessed and guesses the routing used.
    predicted: PredictorTally,
    /// When the prefill started.
    started: Instant,
    /// Kernel-reported storage reads of the process when generation started.
    kernel_read_bytes_before: Option<u64>,
    /// Bytes of the distinct expert slices the prompt's pass routed to.
    prefill_distinct_bytes: u64,
}

/// The prompt's tokens and the micro-batch they are prefilled in.
#[derive(Clone, Copy)]
struct PromptBatches<'p> {
    tokens: &'p [crate::llama::Token],
    ubatch: u32,
    /// Its first tokens already in the KV cache (`--prompt-cache-file`).
    cached: usize,
}

/// Generate through the accounting sink: one row per token to `telemetry`.
fn generate_metered<'t>(
    cfg: &RunConfig,
    target: &mut Target<'t>,
    prompt: PromptBatches<'_>,
    telemetry: &Telemetry,
    on_text: impl FnMut(&str),
    mtp: Option<&mut MtpActor<'_, 't>>,
) -> Metered {
    let PromptBatches {
        tokens,
        ubatch,
        cached,
    } = prompt;
    memory::reset_peak_rss();
    let kernel_read_bytes_before = memory::io_read_bytes();
    let mut rows = Vec::new();
    let mut sink = Sink::new(on_text, &mut rows, telemetry, cfg.speculation.is_on());
    let mut ngram = cfg
        .speculation
        .source
        .ngram()
        .map(|m| generate::NgramDrafter::new(m as usize));
    let t0 = Instant::now();
    let opts = generate::Options {
        limit: generate::Limit {
            n_predict: cfg.n_predict,
            ignore_eos: cfg.ignore_eos,
        },
        n_batch: ubatch as usize,
        sampling: cfg.sampling.clone(),
        stop: cfg.stop.clone(),
        draft_max: cfg.speculation.draft_max as usize,
        cached,
        special_text: false,
        grammar: None,
    };
    let mut run = |d: Option<&mut dyn generate::Drafter<'t>>| {
        generate::generate_opts(target, tokens, &opts, &mut sink, d)
    };
    let res = match gated_sources(ngram.as_mut(), mtp) {
        Some(generate::Sources::One(d, _)) if !cfg.speculation.gated => run(Some(d)),
        // `--spec auto` mixes its sources through the gate, so it is always gated.
        Some(sources) => {
            let mut g = generate::GatedDrafter::new(sources, cfg.speculation.draft_max as usize);
            run(Some(&mut g)).map(|mut r| {
                r.spec.gate = Some(g.stats);
                r
            })
        }
        None => run(None),
    };
    if let Ok(g) = &res {
        if g.stop == generate::StopReason::EndOfText && !g.tokens.is_empty() {
            // The last decode produced the end-of-text token, which is not
            // emitted: rows stay one per generated token.
            sink.drop_pending();
        }
    }
    sink.flush();
    let decode_span = sink.decode_span();
    let predicted = std::mem::take(&mut sink.predicted);
    let prefill_distinct_bytes = sink.prefill_distinct_bytes;
    drop(sink);
    Metered {
        res,
        rows,
        decode_span,
        predicted,
        started: t0,
        kernel_read_bytes_before,
        prefill_distinct_bytes,
    }
}
