//! The end of a run: which error (if any) caused its end, the totals of the
//! CSV trailer and `BMOE_DONE`, and the [`RunReport`].

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bmoe_decode::metrics::PredictorTally;
use bmoe_decode::telemetry::{json_object, Telemetry};
use bmoe_flash::cache::Requester;

use super::assemble::{Assembly, Backend, Loaded};
use super::config::SpecConfig;
use super::error::EngineError;
use super::note::Note;
use super::prefill::{PrefillFacts, PrefillReport};
use super::report::{self, Totals};
use super::run_report::{
    ExpertUse, FlashTotals, MemoryTotals, PrefetchReport, RunReport, SpecReport, TokenRow,
};
use crate::draft::HeadReport;
use crate::generate::{GenerateError, Generation, StopReason};
use crate::llama::ObserverFailure;
use crate::stream::memory;

/// What the generation produced and measured, before the run's totals.
pub(super) struct Metered {
    pub(super) res: Result<Generation, GenerateError>,
    pub(super) rows: Vec<TokenRow>,
    /// From the first token to the last kept one (see [`super::report::decode_rate`]).
    pub(super) decode_span: Duration,
    /// Predictive prefetch: experts guessed and guesses the routing used.
    pub(super) predicted: PredictorTally,
    /// When the prefill started.
    pub(super) started: Instant,
    /// Kernel-reported storage reads of the process when generation started.
    pub(super) kernel_read_bytes_before: Option<u64>,
    /// Bytes of the distinct expert slices the prompt's pass routed to.
    pub(super) prefill_distinct_bytes: u64,
}

/// How generation ended, as the engine saw it.
pub(super) struct Ended {
    pub(super) metered: Metered,
    pub(super) head: HeadReport,
    /// The verify hook's first error (it aborted a decode because of it).
    pub(super) observer_failure: Option<ObserverFailure>,
    /// The context's abort flag was raised (by the hook).
    pub(super) aborted_by_hook: bool,
    pub(super) startup: super::startup::Startup,
}

/// Bytes the flash actor read for `r` (0 when resident).
fn requester_bytes(backend: &Backend, r: Requester) -> u64 {
    backend
        .streamer()
        .map(|s| s.flash.counters().read_bytes[r.index()].load(Ordering::Relaxed))
        .unwrap_or(0)
}

/// The flash split: what the MTP head's own passes streamed, against the
/// verify decodes.
#[derive(Clone, Copy)]
struct FlashSplit {
    head: u64,
    verify: u64,
}

impl FlashSplit {
    fn of(backend: &Backend) -> Self {
        Self {
            head: requester_bytes(backend, Requester::Draft),
            verify: requester_bytes(backend, Requester::Verify),
        }
    }
}

/// What the run measured at its end, before telemetry closes.
struct Closing {
    split: FlashSplit,
    peak_rss_bytes: u64,
    prefill: PrefillReport,
}

impl Closing {
    fn gather(m: &Metered, backend: &Backend, facts: PrefillFacts) -> Self {
        let prefill_row = m.rows.iter().find(|r| r.prefill);
        Self {
            split: FlashSplit::of(backend),
            peak_rss_bytes: memory::rss_bytes().1,
            prefill: PrefillReport::new(prefill_row, m.prefill_distinct_bytes, facts),
        }
    }
}

/// What the CSV trailer and `BMOE_DONE` total, besides the rows.
struct TrailerFacts<'a> {
    prompt_tokens: usize,
    /// From the prefill's start to the end of generation.
    elapsed: Duration,
    failed: bool,
    dropped_events: u64,
    head: &'a HeadReport,
    startup: &'a super::startup::Startup,
    closing: &'a Closing,
    /// `--route-from`: the trace whose routing was forced.
    route_from: Option<&'a std::path::Path>,
}

/// The trailer: the rows' totals, the head's streaming, start-up and the
/// prompt's pass.
fn trailer(m: &Metered, t: &TrailerFacts<'_>) -> Vec<(String, String)> {
    let interrupted = matches!(&m.res, Ok(g) if g.stop == StopReason::Interrupted);
    let spec = m.res.as_ref().map(|g| g.spec).unwrap_or_default();
    let generated = match &m.res {
        Ok(g) => g.tokens.len(),
        Err(_) => m.rows.len(),
    };
    let mut pairs = Totals {
        rows: &m.rows,
        generated,
        prompt_tokens: t.prompt_tokens,
        elapsed: t.elapsed,
        decode_span: m.decode_span,
        aborted: t.failed || interrupted,
        dropped_events: t.dropped_events,
        peak_rss_bytes: t.closing.peak_rss_bytes,
        spec: &spec,
    }
    .pairs();
    pairs.extend(report::head_pairs(t.head, t.closing.split.head));
    let prefill = m.res.as_ref().map(|g| g.prefill).unwrap_or_default();
    pairs.extend(t.startup.trailer_pairs(prefill));
    pairs.extend(t.closing.prefill.pairs());
    if let Some(p) = t.route_from {
        pairs.push(("route_from".into(), p.display().to_string()));
    }
    pairs
}

/// Read-ahead's settings and the flash actor's verdicts (none when resident).
fn prefetch(backend: &Backend, predicted: PredictorTally) -> PrefetchReport {
    match backend.stream() {
        Some(s) => report::prefetch_report(&s.streamer, &s.cfg, predicted),
        None => PrefetchReport::default(),
    }
}

/// The generation, or the run's failure with the `BMOE_DONE` line of what
/// was generated: the failure's cause first (a streaming error that aborted
/// a decode, which makes llama_decode fail too, else the generation's own
/// error), then a trailer that could not be written.
fn outcome(
    res: Result<Generation, GenerateError>,
    hook_failure: Option<ObserverFailure>,
    finished: Result<u64, bmoe_decode::telemetry::TelemetryError>,
    done_line: &str,
) -> Result<Generation, EngineError> {
    let fail = |cause: EngineError| EngineError::Failed {
        cause: Box::new(cause),
        done_line: done_line.to_string(),
    };
    if let Some(e) = hook_failure {
        return Err(fail(EngineError::Streaming(e)));
    }
    let generation = res.map_err(|e| fail(e.into()))?;
    finished.map_err(|e| fail(e.into()))?;
    Ok(generation)
}

/// Once the context is gone (its verify hook flushed every decode's trace):
/// the route trace put in place (a note saying where), and `--cache-warm`'s
/// lines.
fn close_streamer(backend: &Backend, notes: &mut Vec<Note>) -> Result<Vec<String>, EngineError> {
    let Some(s) = backend.streamer() else {
        return Ok(Vec::new());
    };
    if let Some(path) = s.commit_route_trace()? {
        notes.push(Note::RouteTrace { path });
    }
    let mut lines: Vec<String> = s
        .finish_warm()
        .map(|(line, saved)| vec![line, format!("moe-cache-warm: {saved}")])
        .unwrap_or_default();
    lines.extend(s.pretouch_line());
    Ok(lines)
}

/// Total the run, close telemetry with the trailer, and report (or fail with
/// the cause and the `BMOE_DONE` line of what was generated).
pub(super) fn report(
    a: Assembly,
    telemetry: Telemetry,
    ended: Ended,
) -> Result<RunReport, EngineError> {
    let m = ended.metered;
    let elapsed: Duration = m.started.elapsed();
    let Assembly { ctx, loaded: a } = a;
    let Loaded {
        backend, mut notes, ..
    } = a;
    notes.extend(backend.streamer().and_then(|s| s.faults.as_ref()).map(|c| {
        Note::InjectedFaults {
            summary: c.summary(),
        }
    }));
    // A hook error that aborted no decode is no failure.
    let hook_failure = ended.observer_failure.filter(|_| ended.aborted_by_hook);
    let closing = Closing::gather(&m, &backend, a.prefill);
    let facts = TrailerFacts {
        prompt_tokens: a.tokens.len(),
        elapsed,
        failed: hook_failure.is_some() || m.res.is_err(),
        dropped_events: telemetry.dropped(),
        head: &ended.head,
        startup: &ended.startup,
        closing: &closing,
        route_from: a.cfg.route_from.as_deref(),
    };
    let trailer = trailer(&m, &facts);
    // BMOE_DONE names the mode that ran (a default run may be either).
    let mut done = trailer.clone();
    done.push(("mode".into(), backend.kind().name().into()));
    let done_line = json_object(&done);
    let finished = telemetry.finish(trailer, Duration::from_secs(5));
    let generation = outcome(m.res, hook_failure, finished, &done_line)
        .map_err(|e| super::rpc::blame_hosts(e, a.cfg.rpc.as_ref()))?;
    let kernel_read_bytes = (m.kernel_read_bytes_before)
        .zip(memory::io_read_bytes())
        .map(|(a, b)| b.saturating_sub(a));
    // The verify hook goes with the context: every decode's trace is flushed.
    drop(ctx);
    let warm_lines = close_streamer(&backend, &mut notes)?;
    let (reader, budget, flash_bytes, peak_resident) = report::flash_facts(backend.streamer());
    Ok(RunReport {
        generation,
        decode_span: m.decode_span,
        spec: SpecReport {
            config: SpecConfig {
                draft_max: a.cfg.speculation.width(),
                ..a.cfg.speculation
            },
            head_read_bytes: closing.split.head,
            verify_read_bytes: closing.split.verify,
            head: ended.head,
        },
        rows: m.rows,
        mode: backend.kind(),
        notes,
        flash: FlashTotals {
            reader,
            read_bytes: flash_bytes,
            kernel_read_bytes,
        },
        memory: MemoryTotals {
            cache_budget_bytes: budget,
            peak_resident_bytes: peak_resident,
            peak_rss_bytes: closing.peak_rss_bytes,
        },
        prefetch: prefetch(&backend, m.predicted),
        warm_lines,
        experts: ExpertUse {
            used: a.k,
            model: a.layout.n_expert_used,
            drop_cold: backend.drop_cold(),
        },
        layout: a.layout,
        done_line,
        startup: ended.startup,
        prefill: closing.prefill,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Result<Generation, GenerateError> {
        Ok(Generation {
            prompt_tokens: 1,
            tokens: vec![1],
            text: String::new(),
            stop: StopReason::Limit,
            prefill: Duration::ZERO,
            decode: Duration::ZERO,
            spec: Default::default(),
        })
    }

    fn outcome_of(
        res: Result<Generation, GenerateError>,
        hook: Option<&str>,
    ) -> Result<Generation, EngineError> {
        let hook = hook.map(|m| std::sync::Arc::new(std::io::Error::other(m)) as ObserverFailure);
        outcome(res, hook, Ok(0), "{}")
    }

    fn cause_of(r: Result<Generation, EngineError>) -> EngineError {
        match r {
            Err(EngineError::Failed { cause, done_line }) => {
                assert_eq!(done_line, "{}");
                *cause
            }
            other => panic!("not a failure with its done line: {other:?}"),
        }
    }

    #[test]
    fn a_hook_error_that_aborted_the_decode_is_the_cause() {
        let c = cause_of(outcome_of(
            Err(GenerateError::NoLogits),
            Some("read failed"),
        ));
        assert!(matches!(c, EngineError::Streaming(_)), "{c:?}");
        assert_eq!(c.to_string(), "streaming stopped the decode: read failed");
        let c = cause_of(outcome_of(ok(), Some("read failed")));
        assert!(matches!(c, EngineError::Streaming(_)), "{c:?}");
    }

    #[test]
    fn without_a_hook_error_the_generation_decides() {
        assert!(outcome_of(ok(), None).is_ok());
        let c = cause_of(outcome_of(Err(GenerateError::NoLogits), None));
        assert!(matches!(c, EngineError::Generate(GenerateError::NoLogits)));
        let csv = bmoe_decode::telemetry::TelemetryError::Timeout(Duration::from_secs(5));
        let c = cause_of(outcome(ok(), None, Err(csv), "{}"));
        assert!(matches!(c, EngineError::Telemetry(_)), "{c:?}");
    }
}
