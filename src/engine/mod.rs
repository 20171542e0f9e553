//! Engine assembly for `bmoe run`: resident (plain llama.cpp mmap) or streamed
//! (flash actor + verify hook), greedy generation, per-token accounting.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::draft::{DraftError, HeadReport, MtpActor, MtpActorConfig};
use crate::generate::{self, DecodeStep, GenerateError, Generation, GenerationSink};
use crate::layout::MoeLayout;
use crate::llama::{Context, ContextParams, LlamaError, Model, ModelParams, TargetRef};
use crate::stream::{memory, SharedStats, StreamConfig, StreamError, Streamer};
use bmoe_actors::telemetry::{self, json_object, Row, Telemetry, TelemetryConfig, TelemetryError};

pub mod graph_check;
mod report;
pub use report::decode_rate;
use report::Totals;

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
    #[error("{0}")]
    Config(String),
    /// A run that failed after generation started: the cause, and the
    /// `BMOE_DONE` object of what was generated (aborted=1), so the binary can
    /// still print it.
    #[error("{cause}")]
    Failed {
        cause: Box<EngineError>,
        done_line: String,
    },
}

/// How expert weights reach the matmuls.
#[derive(Debug, Clone)]
pub enum Mode {
    /// llama.cpp's own mmap path (the comparison baseline).
    Resident,
    /// Experts streamed by the flash actor (the default for MoE models).
    Stream(StreamConfig),
}

/// The MTP draft context's physical batch (its compute buffer scales with
/// n_ubatch x vocab; the drafts are a few tokens wide).
pub const MTP_UBATCH: u32 = 32;
/// The widest `--draft`.
pub const MAX_DRAFT: u32 = 8;
/// The target context's logical and physical batch.
pub const TARGET_UBATCH: u32 = 512;
// A verify batch ([last, d1..dN]) must fit one ubatch of each context, and a
// hybrid target needs n_ubatch >= n_rs_seq (= the draft width) + 2. Neither
// width is a setting, so this is checked here rather than refused at load.
const _: () = assert!(MAX_DRAFT + 2 <= MTP_UBATCH && MAX_DRAFT + 2 <= TARGET_UBATCH);

/// Self-speculative decoding: where drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Speculation {
    #[default]
    Off,
    /// `--ngram`: the longest earlier match of the corpus's suffix.
    Ngram { min_match: u32 },
    /// `--mtp`: the model's own MTP (nextn) head; it stops drafting once its
    /// confidence falls below `p_min`. When streaming, `predemand` reads the
    /// drafting pass's experts in the background during the verify decode
    /// (`--head-predemand`; off by default: on the 2-core test host it cost the
    /// verify decode about what it saved the head, docs/speculation.md).
    Mtp { p_min: f32, predemand: bool },
}

impl Speculation {
    pub fn name(self) -> &'static str {
        match self {
            Speculation::Off => "off",
            Speculation::Ngram { .. } => "ngram",
            Speculation::Mtp { .. } => "mtp",
        }
    }
}

/// Everything `bmoe run` settles before generating.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub model: PathBuf,
    pub prompt: String,
    pub chat: bool,
    pub n_predict: u32,
    /// `--ignore-eos`: never stop at the end of text.
    pub ignore_eos: bool,
    pub threads: u32,
    pub n_ctx: u32,
    pub mode: Mode,
    /// Whether `--moe-stream` was given explicitly (a dense model is then an error).
    pub stream_explicit: bool,
    /// `--csv` and `--progress`.
    pub telemetry: TelemetryConfig,
    /// `--n-expert-used K`: route each token to K experts instead of the
    /// model's own count (lossy unless K equals it).
    pub n_expert_used: Option<u32>,
    /// Draft source (`--ngram`), and the verify batch's draft width (`--draft`).
    pub speculation: Speculation,
    pub draft_max: u32,
}

impl RunConfig {
    /// Experts routed per token, after `--n-expert-used`.
    pub fn experts_used(&self, layout: &MoeLayout) -> u32 {
        self.n_expert_used.unwrap_or(layout.n_expert_used)
    }

    /// Whether a knob that changes the output is on.
    pub fn lossy(&self, layout: &MoeLayout) -> bool {
        let drop = matches!(&self.mode, Mode::Stream(sc) if sc.drop_cold > 0.0);
        drop || self.experts_used(layout) != layout.n_expert_used
    }
}

/// Per-token accounting (row i is the decode that produced token i; row 0 the
/// prefill; under a multi-token decode its whole cost sits on its first row).
pub type TokenRow = Row;

/// What a run produced and measured.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub generation: Generation,
    /// From the first token to the last (see [`decode_rate`]).
    pub decode_span: Duration,
    /// The draft source and width (`Off` and 0 without speculation).
    pub speculation: Speculation,
    pub draft_max: u32,
    /// Streamed bytes read for the MTP head's passes and for the verify decodes.
    pub head_read_bytes: u64,
    pub verify_read_bytes: u64,
    /// The MTP head's streaming on the draft actor (zeros otherwise).
    pub head: HeadReport,
    pub rows: Vec<TokenRow>,
    /// "resident" or "stream".
    pub mode: &'static str,
    pub notes: Vec<String>,
    pub cache_budget_bytes: u64,
    pub reader: String,
    /// Flash actor's total bytes over the whole run (prefill included).
    pub flash_read_bytes: u64,
    /// Kernel-reported storage reads of the process over the generation.
    pub kernel_read_bytes: Option<u64>,
    pub peak_resident_bytes: u64,
    pub peak_rss_bytes: u64,
    /// Read-ahead: settings and the flash actor's verdicts.
    pub prefetch: PrefetchReport,
    /// Experts routed per token (after `--n-expert-used`) and the model's own count.
    pub experts_used: u32,
    pub experts_used_model: u32,
    /// `--drop-cold-experts` threshold (0: off).
    pub drop_cold: f32,
    pub dense_bytes: u64,
    pub layout: MoeLayout,
    /// The `BMOE_DONE` JSON object (the same totals as the CSV trailer).
    pub done_line: String,
}

/// What prefetching did over a run.
#[derive(Debug, Clone, Default)]
pub struct PrefetchReport {
    /// `--prefetch K` (temporal depth) and `--predict-prefetch`.
    pub layers: u32,
    pub predictive: bool,
    /// Bytes read ahead (all of them, including any after the last decode).
    pub read_bytes: u64,
    pub useful_bytes: u64,
    pub wasted_bytes: u64,
    pub hints_dropped: u64,
    pub errors: u64,
    /// Predictive: experts guessed and how many the real routing used.
    pub predicted: u64,
    pub predicted_used: u64,
}

impl PrefetchReport {
    pub fn enabled(&self) -> bool {
        self.layers > 0 || self.predictive
    }
}

struct Sink<'a, F: FnMut(&str)> {
    on_text: F,
    stats: Option<SharedStats>,
    rows: &'a mut Vec<TokenRow>,
    telemetry: Option<&'a Telemetry>,
    usage: memory::Usage,
    /// Prefill chunks folded into the first token's row.
    prefill: Option<TokenRow>,
    /// The last decode's row, collecting the text of the token it produced.
    pending: Option<TokenRow>,
    /// When the prefill's last decode ended (the first token is known then).
    prefill_done: Option<Instant>,
    /// When the decode of the pending row ended, and of the last row kept.
    pending_done: Option<Instant>,
    kept_done: Option<Instant>,
    /// Predictive prefetch: experts guessed and guesses the routing used.
    predicted: u64,
    predicted_used: u64,
    /// Speculation is on (the mtp_* columns are filled).
    speculating: bool,
}

impl<F: FnMut(&str)> Sink<'_, F> {
    /// The row of the token whose text is complete goes to the list and the telemetry actor.
    fn flush(&mut self) {
        if let Some(p) = self.prefill.take() {
            self.push(p);
        }
        if let Some(r) = self.pending.take() {
            self.push(r);
            self.kept_done = self.pending_done;
        }
    }

    /// The end-of-text token's decode produced no token: its row is dropped.
    fn drop_pending(&mut self) {
        self.pending = None;
        self.pending_done = None;
    }

    /// From the first token to the last kept one (see [`decode_rate`]).
    fn decode_span(&self) -> Duration {
        match (self.prefill_done, self.kept_done) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        }
    }

    fn push(&mut self, mut row: TokenRow) {
        row.step = self.rows.len() as u64;
        if let Some(t) = self.telemetry {
            t.row(row.clone());
        }
        self.rows.push(row);
    }
}

impl<F: FnMut(&str)> GenerationSink for Sink<'_, F> {
    fn text(&mut self, piece: &str) {
        (self.on_text)(piece);
        if let Some(p) = self.prefill.take() {
            self.pending = Some(p);
        }
        if let Some(r) = self.pending.as_mut() {
            r.text.push_str(piece);
        }
    }

    fn decoded(&mut self, step: DecodeStep) {
        let u = memory::usage();
        let s = self
            .stats
            .as_ref()
            .map(|s| s.borrow_mut().take())
            .unwrap_or_default();
        let row = TokenRow {
            wall_ms: step.elapsed.as_secs_f64() * 1e3,
            stall_ms: s.stall.as_secs_f64() * 1e3,
            io_ms: s.io.as_secs_f64() * 1e3,
            read_bytes: s.read_bytes,
            hits: s.hits,
            misses: s.misses,
            evictions: s.evictions,
            majflt: u.majflt - self.usage.majflt,
            minflt: u.minflt - self.usage.minflt,
            cpu_ms: u.cpu_ms - self.usage.cpu_ms,
            batch: step.n_tokens as u64,
            prefill: step.prefill,
            prefetch_bytes: s.prefetch_bytes,
            dropped_experts: s.dropped,
            mtp_batch: if self.speculating && !step.prefill {
                step.n_tokens as u64
            } else {
                0
            },
            mtp_draft_ms: step.draft.as_secs_f64() * 1e3,
            ..TokenRow::default()
        };
        self.predicted += s.predicted;
        self.predicted_used += s.predicted_used;
        self.usage = u;
        let now = Instant::now();
        if step.prefill {
            self.prefill_done = Some(now);
            let p = self.prefill.get_or_insert_with(TokenRow::default);
            p.prefill = true;
            p.batch += row.batch;
            p.wall_ms += row.wall_ms;
            p.stall_ms += row.stall_ms;
            p.io_ms += row.io_ms;
            p.read_bytes += row.read_bytes;
            p.hits += row.hits;
            p.misses += row.misses;
            p.evictions += row.evictions;
            p.majflt += row.majflt;
            p.minflt += row.minflt;
            p.cpu_ms += row.cpu_ms;
            p.prefetch_bytes += row.prefetch_bytes;
            p.dropped_experts += row.dropped_experts;
        } else {
            self.flush();
            self.pending = Some(row);
            self.pending_done = Some(now);
        }
    }

    fn next_token(&mut self) {
        // One more token of the same verify decode: its cost stays on the
        // group's first row, this row carries only the token's text.
        self.flush();
        self.pending = Some(TokenRow::default());
    }

    fn should_stop(&mut self) -> bool {
        crate::interrupt::requested().is_some()
            || self.telemetry.is_some_and(|t| t.write_failed())
            || crate::stdio::stdout_failed().is_some()
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
    let layout = MoeLayout::open(&cfg.model)?;
    let mut notes = Vec::new();
    let mut mode = cfg.mode.clone();
    if let Mode::Stream(_) = mode {
        if layout.n_expert > 0 && !layout.is_moe() {
            // It says it has experts, but not in a layout bmoe can stream.
            return Err(StreamError::UnknownLayout {
                model: cfg.model.display().to_string(),
                n_expert: layout.n_expert,
            }
            .into());
        }
        if !layout.is_moe() {
            if cfg.stream_explicit {
                return Err(StreamError::NotMoe {
                    model: cfg.model.display().to_string(),
                    n_expert: layout.n_expert,
                }
                .into());
            }
            notes.push(
                "dense model (no expert tensors): running resident, nothing to stream".into(),
            );
            mode = Mode::Resident;
        }
    }
    if let Some(k) = cfg.n_expert_used {
        if k == 0 || k > layout.n_expert {
            return Err(EngineError::Config(format!(
                "--n-expert-used {k}: this model has {} experts per layer (routes {} by default); \
                 choose 1..={}",
                layout.n_expert, layout.n_expert_used, layout.n_expert
            )));
        }
    }
    if let Speculation::Mtp { p_min, .. } = cfg.speculation {
        if layout.n_layer_nextn == 0 {
            return Err(EngineError::Config(format!(
                "--mtp needs a model with an MTP (nextn) head; {} has none (nextn_predict_layers \
                 is 0): use --ngram for drafts without a head",
                cfg.model.display()
            )));
        }
        if !(p_min.is_finite() && (0.0..=1.0).contains(&p_min)) {
            return Err(EngineError::Config(format!(
                "--mtp-p-min {p_min}: give a probability in 0..=1"
            )));
        }
    }
    let k = cfg.experts_used(&layout);
    let streamer = match &mode {
        Mode::Stream(sc) => Some((
            Streamer::start(&cfg.model, &layout, sc, k)?,
            sc.dense,
            sc.overlap,
        )),
        Mode::Resident => None,
    };
    let model = Arc::new(Model::load(
        &cfg.model,
        &ModelParams {
            use_mmap: true,
            load_mtp: matches!(cfg.speculation, Speculation::Mtp { .. }),
            int_overrides: match cfg.n_expert_used {
                Some(k) => vec![(format!("{}.expert_used_count", layout.arch), k as i64)],
                None => Vec::new(),
            },
        },
    )?);
    let abort = Arc::new(AtomicBool::new(false));
    let speculating = cfg.speculation != Speculation::Off;
    let mut params = ContextParams {
        n_ctx: cfg.n_ctx,
        n_batch: TARGET_UBATCH,
        n_ubatch: TARGET_UBATCH,
        n_threads: cfg.threads,
        // Recurrent-state snapshots so a hybrid model can roll back rejected
        // drafts (clamped to 0 by llama.cpp on archs that need none).
        n_rs_seq: if speculating { cfg.draft_max } else { 0 },
        abort: Some(abort.clone()),
        ..ContextParams::default()
    };
    let mut stats = None;
    let mut anon = None;
    if let Some((s, dense, overlap)) = &streamer {
        anon = s.prepare_mapping(&cfg.model, *dense)?;
        notes.extend(s.notes.iter().cloned());
        let (observer, st) = s.verify_observer(abort.clone(), anon.clone(), *overlap);
        params.observer = Some(observer);
        stats = Some(st);
    }
    let mut ctx = Context::new(model.clone(), params)?;
    if ctx.n_ctx() != cfg.n_ctx {
        notes.push(format!(
            "context: {} tokens (-c {} rounded up by llama.cpp to a multiple of 256)",
            ctx.n_ctx(),
            cfg.n_ctx
        ));
    }
    // The MTP head runs on the draft actor's thread, tied to the target before
    // its first decode.
    let mut mtp = match cfg.speculation {
        Speculation::Mtp { p_min, predemand } => {
            let actor_cfg = MtpActorConfig {
                model: model.clone(),
                n_ctx: cfg.n_ctx,
                n_threads: cfg.threads,
                n_ubatch: MTP_UBATCH,
                draft_max: cfg.draft_max as usize,
                p_min,
                // The head's experts stream too (requester Draft), and its dense
                // weights share the verify hook's anonymous copies.
                hook: streamer
                    .as_ref()
                    .map(|(s, _, _)| s.draft_hook_parts(anon.clone())),
                predemand,
            };
            let target = TargetRef::new(&mut ctx);
            // The loop hands the target to the actor one call at a time, waiting for each reply.
            // SAFETY: `ctx` is declared before `mtp`, so it outlives the actor (also finished after generation).
            Some(unsafe { MtpActor::spawn(target, actor_cfg) }?)
        }
        _ => None,
    };
    let tokens = generate::prompt_tokens(&model, &cfg.prompt, cfg.chat)?;
    let preamble = preamble(
        cfg,
        &layout,
        streamer.as_ref().map(|s| &s.0),
        &model,
        ctx.n_ctx(),
    );
    let telemetry = Telemetry::start(&cfg.telemetry, csv_file, &preamble)?;

    memory::reset_peak_rss();
    let kernel0 = memory::io_read_bytes();
    let mut rows = Vec::new();
    let mut sink = Sink {
        on_text,
        stats: stats.clone(),
        rows: &mut rows,
        telemetry: Some(&telemetry),
        usage: memory::usage(),
        prefill: None,
        pending: None,
        prefill_done: None,
        pending_done: None,
        kept_done: None,
        predicted: 0,
        predicted_used: 0,
        speculating: cfg.speculation != Speculation::Off,
    };
    let mut ngram = match cfg.speculation {
        Speculation::Ngram { min_match } => Some(generate::NgramDrafter::new(min_match as usize)),
        Speculation::Off | Speculation::Mtp { .. } => None,
    };
    let drafter = match (ngram.as_mut(), mtp.as_mut()) {
        (Some(d), _) => Some(d as &mut dyn generate::Drafter),
        (None, Some(d)) => Some(d as &mut dyn generate::Drafter),
        (None, None) => None,
    };
    let t0 = Instant::now();
    let res = generate::generate_with(
        &mut ctx,
        &tokens,
        generate::Limit {
            n_predict: cfg.n_predict,
            ignore_eos: cfg.ignore_eos,
        },
        512,
        &mut sink,
        drafter,
        cfg.draft_max as usize,
    );
    if let Ok(g) = &res {
        if g.stop == generate::StopReason::EndOfText && !g.tokens.is_empty() {
            // The last decode produced the end-of-text token, which is not
            // emitted: rows stay one per generated token.
            sink.drop_pending();
        }
    }
    sink.flush();
    let decode_span = sink.decode_span();
    let predicted = (sink.predicted, sink.predicted_used);
    drop(sink);
    // Join the draft actor before anything else reads the target context.
    let head = mtp.as_mut().map(|a| a.finish()).unwrap_or_default();
    let elapsed: Duration = t0.elapsed();
    let stream_error = stats.as_ref().and_then(|s| s.borrow().error.clone());
    let stats_error = stream_error.is_some();
    if let Some(c) = streamer.as_ref().and_then(|s| s.0.faults.as_ref()) {
        notes.push(c.summary());
    }
    let failure = match (&res, stream_error) {
        (_, Some(e)) if abort.load(Ordering::SeqCst) => Some(EngineError::Streaming(e)),
        (Ok(_), _) => None,
        (Err(_), _) => res
            .as_ref()
            .err()
            .map(|e| EngineError::Streaming(e.to_string())),
    };
    let interrupted = matches!(&res, Ok(g) if g.stop == generate::StopReason::Interrupted);
    let (_, peak_rss) = memory::rss_bytes();
    let spec = res.as_ref().map(|g| g.spec).unwrap_or_default();
    // The flash split: what the MTP head's own passes streamed, against the verify decodes.
    let requester_bytes = |r: bmoe_actors::cache::Requester| {
        streamer
            .as_ref()
            .map(|s| s.0.flash.counters().read_bytes[r.index()].load(Ordering::Relaxed))
            .unwrap_or(0)
    };
    let head_read_bytes = requester_bytes(bmoe_actors::cache::Requester::Draft);
    let verify_read_bytes = requester_bytes(bmoe_actors::cache::Requester::Verify);
    let generated = match &res {
        Ok(g) => g.tokens.len(),
        Err(_) => rows.len(),
    };
    let mut trailer = Totals {
        rows: &rows,
        generated,
        prompt_tokens: tokens.len(),
        elapsed,
        decode_span,
        aborted: failure.is_some() || interrupted,
        dropped_events: telemetry.dropped(),
        peak_rss_bytes: peak_rss,
        spec: &spec,
    }
    .pairs();
    trailer.push(("mtp_head_read_bytes".into(), head_read_bytes.to_string()));
    trailer.push((
        "mtp_head_stall_s".into(),
        format!("{:.6}", head.stall.as_secs_f64()),
    ));
    trailer.push(("mtp_head_hits".into(), head.hits.to_string()));
    trailer.push(("mtp_head_misses".into(), head.misses.to_string()));
    trailer.push((
        "mtp_head_predemand_bytes".into(),
        head.predemand_read_bytes.to_string(),
    ));

    let done_line = json_object(&trailer);
    let finished = telemetry.finish(trailer, Duration::from_secs(5));
    if let Some(f) = failure {
        // The first error wins: a streaming failure makes llama_decode fail
        // too, but the cause is the streaming error.
        let cause = match (res, f) {
            (_, f @ EngineError::Streaming(_)) if stats_error => f,
            (Err(e), _) => e.into(),
            (Ok(_), f) => f,
        };
        return Err(EngineError::Failed {
            cause: Box::new(cause),
            done_line,
        });
    }
    if let Err(e) = finished {
        return Err(EngineError::Failed {
            cause: Box::new(e.into()),
            done_line,
        });
    }
    let generation = res?;
    let kernel1 = memory::io_read_bytes();
    drop(ctx);
    let (reader, budget, flash_bytes, peak_resident) = match &streamer {
        Some((s, _, _)) => {
            let c = s.flash.counters();
            (
                s.flash.reader_description().to_string(),
                s.budget_bytes,
                c.read_bytes_total(),
                c.peak_resident_bytes.load(Ordering::Relaxed),
            )
        }
        None => ("llama.cpp mmap".into(), 0, 0, 0),
    };
    let prefetch = match (&streamer, &mode) {
        (Some((s, _, _)), Mode::Stream(sc)) => {
            let c = s.flash.counters();
            let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            PrefetchReport {
                layers: sc.prefetch,
                predictive: sc.predict_prefetch,
                read_bytes: ld(&c.read_bytes[bmoe_actors::cache::Requester::Prefetch.index()]),
                useful_bytes: ld(&c.prefetch_useful_bytes),
                wasted_bytes: ld(&c.prefetch_wasted_bytes),
                hints_dropped: ld(&c.prefetch_hints_dropped),
                errors: ld(&c.prefetch_errors),
                predicted: predicted.0,
                predicted_used: predicted.1,
            }
        }
        _ => PrefetchReport::default(),
    };
    let drop_cold = match &mode {
        Mode::Stream(sc) => sc.drop_cold,
        Mode::Resident => 0.0,
    };
    Ok(RunReport {
        generation,
        decode_span,
        speculation: cfg.speculation,
        draft_max: cfg.draft_max,
        head_read_bytes,
        verify_read_bytes,
        head,
        rows,
        mode: if streamer.is_some() {
            "stream"
        } else {
            "resident"
        },
        notes,
        cache_budget_bytes: budget,
        reader,
        flash_read_bytes: flash_bytes,
        kernel_read_bytes: kernel0.zip(kernel1).map(|(a, b)| b.saturating_sub(a)),
        peak_resident_bytes: peak_resident,
        prefetch,
        experts_used: k,
        experts_used_model: layout.n_expert_used,
        drop_cold,
        peak_rss_bytes: peak_rss,
        dense_bytes: layout.dense_bytes(),
        layout,
        done_line,
    })
}

/// The resolved configuration, as `key=value` pairs for the CSV preamble.
fn preamble(
    cfg: &RunConfig,
    layout: &MoeLayout,
    streamer: Option<&Streamer>,
    model: &Model,
    n_ctx: u32,
) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = Vec::new();
    let mut kv = |k: &str, val: String| v.push((k.to_string(), val));
    kv("engine_version", crate::VERSION.to_string());
    kv("model", cfg.model.display().to_string());
    kv("arch", layout.arch.clone());
    kv("n_layer", model.n_layer().to_string());
    kv("n_layer_nextn", layout.n_layer_nextn.to_string());
    kv("n_expert", layout.n_expert.to_string());
    kv("n_expert_used", cfg.experts_used(layout).to_string());
    kv("n_expert_used_model", layout.n_expert_used.to_string());
    kv("threads", cfg.threads.to_string());
    kv("n_ctx", n_ctx.to_string());
    kv("n_ubatch", "512".to_string());
    kv("n_predict", cfg.n_predict.to_string());
    kv("ignore_eos", (cfg.ignore_eos as u8).to_string());
    kv("chat", (cfg.chat as u8).to_string());
    match (&cfg.mode, streamer) {
        (Mode::Stream(sc), Some(s)) => {
            kv("mode", "stream".into());
            kv("cache_mb", (s.budget_bytes / (1024 * 1024)).to_string());
            kv("io_threads", sc.io_threads.to_string());
            kv(
                "o_direct",
                (s.flash.reader_description().contains("O_DIRECT") as u8).to_string(),
            );
            kv("reader", s.flash.reader_description().to_string());
            kv("overlap", (sc.overlap as u8).to_string());
            kv("dense_weights", sc.dense.name().to_string());
        }
        _ => {
            kv("mode", "resident".into());
            kv("cache_mb", "0".into());
            kv("io_threads", "0".into());
            kv("o_direct", "0".into());
            kv("overlap", "0".into());
            kv("dense_weights", "mmap".into());
        }
    }
    let (prefetch, predict, drop) = match &cfg.mode {
        Mode::Stream(sc) if streamer.is_some() => (sc.prefetch, sc.predict_prefetch, sc.drop_cold),
        _ => (0, false, 0.0),
    };
    kv("prefetch", prefetch.to_string());
    kv("predict_prefetch", (predict as u8).to_string());
    kv("drop_cold_frac", drop.to_string());
    kv("lossy", (cfg.lossy(layout) as u8).to_string());
    kv("spec", cfg.speculation.name().into());
    let (draft_max, min_match, p_min) = match cfg.speculation {
        Speculation::Off => (0, 0, 0.0),
        Speculation::Ngram { min_match } => (cfg.draft_max, min_match, 0.0),
        Speculation::Mtp { p_min, .. } => (cfg.draft_max, 0, p_min),
    };
    kv("spec_draft_max", draft_max.to_string());
    kv("ngram_min_match", min_match.to_string());
    kv("mtp_p_min", p_min.to_string());
    let predemand = matches!(
        cfg.speculation,
        Speculation::Mtp {
            predemand: true,
            ..
        }
    ) && streamer.is_some();
    kv("mtp_head_predemand", (predemand as u8).to_string());
    v
}
