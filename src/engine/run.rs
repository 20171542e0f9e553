//! `bmoe run`'s one generation: assembled, optionally restored from a
//! prompt-cache file, generated with its drafters and telemetry, reported.

use std::time::Instant;

use super::assemble::{self, Loaded, Prompt};
use super::config::{self, preamble, RunConfig};
use super::error::EngineError;
use super::finish::{self, Metered};
use super::prompt_state;
use super::run_report::RunReport;
use super::sink::Sink;
use super::startup::Startup;
use crate::draft::{HeadReport, MtpActor};
use crate::generate;
use crate::llama::Target;
use crate::stream::memory;
use bmoe_decode::telemetry::{self, Telemetry};

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
        text: &cfg.job.prompt,
        chat: cfg.job.chat,
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
    // An interrupted prompt may be only part decoded: its state is not saved.
    let whole = metered
        .res
        .as_ref()
        .is_ok_and(|g| g.stop != generate::StopReason::Interrupted);
    if let Some((f, id)) = pcache.filter(|_| whole) {
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
    let file = cfg.prompt_states.file.clone()?;
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
            n_predict: cfg.job.n_predict,
            ignore_eos: cfg.job.ignore_eos,
        },
        n_batch: ubatch as usize,
        sampling: cfg.job.sampling.clone(),
        stop: cfg.job.stop.clone(),
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
