//! Engine assembly for `bmoe run`: resident (plain llama.cpp mmap) or streamed
//! (flash actor + verify hook), greedy generation, per-token accounting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::draft::{DraftError, HeadReport, MtpActor, MtpActorConfig};
use crate::generate::{self, GenerateError, Generation};
use crate::layout::MoeLayout;
use crate::llama::{Context, ContextParams, LlamaError, Model, ModelParams, TargetRef};
use crate::stream::{memory, StreamError, Streamer};
use bmoe_actors::telemetry::{self, json_object, Row, Telemetry, TelemetryError};

mod config;
pub mod graph_check;
mod report;
mod sink;
use config::preamble;
pub use config::{Mode, RunConfig, Speculation, MAX_DRAFT, MTP_UBATCH, TARGET_UBATCH};
pub use report::decode_rate;
use report::Totals;
use sink::Sink;

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
    let (mode, mut notes) = cfg.check_against(&layout)?;
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
    trailer.extend(report::head_pairs(&head, head_read_bytes));

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
    let (reader, budget, flash_bytes, peak_resident) =
        report::flash_facts(streamer.as_ref().map(|s| &s.0));
    let prefetch = match (&streamer, &mode) {
        (Some((s, _, _)), Mode::Stream(sc)) => report::prefetch_report(s, sc, predicted),
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
