//! The end of a run: which error (if any) caused its end, the totals of the
//! CSV trailer and `BMOE_DONE`, and the [`RunReport`].

use std::sync::atomic::Ordering;
use std::time::Duration;

use bmoe_actors::cache::Requester;
use bmoe_actors::telemetry::{json_object, Telemetry};

use super::assemble::{Assembly, Backend};
use super::prefill::PrefillReport;
use super::report::{self, Totals};
use super::{EngineError, Metered, PrefetchReport, RunReport};
use crate::draft::HeadReport;
use crate::generate::{GenerateError, Generation, StopReason};
use crate::stream::memory;

/// How generation ended, as the engine saw it.
pub(super) struct Ended {
    pub(super) metered: Metered,
    pub(super) head: HeadReport,
    /// The verify hook's first error (it aborted a decode because of it).
    pub(super) observer_failure: Option<String>,
    /// The context's abort flag was raised (by the hook).
    pub(super) aborted_by_hook: bool,
    pub(super) startup: super::Startup,
}

/// The run's failure, if any: a streaming error that aborted a decode, else
/// the generation's own error.
fn failure(
    res: &Result<Generation, GenerateError>,
    stream_error: Option<String>,
    aborted_by_hook: bool,
) -> Option<EngineError> {
    match (res, stream_error) {
        (_, Some(e)) if aborted_by_hook => Some(EngineError::Streaming(e)),
        (Ok(_), _) => None,
        (Err(e), _) => Some(EngineError::Streaming(e.to_string())),
    }
}

/// The first error wins: a streaming failure makes llama_decode fail too, but
/// the cause is the streaming error.
fn cause(
    res: Result<Generation, GenerateError>,
    f: EngineError,
    stream_failed: bool,
) -> EngineError {
    match (res, f) {
        (_, f @ EngineError::Streaming(_)) if stream_failed => f,
        (Err(e), _) => e.into(),
        (Ok(_), f) => f,
    }
}

/// Bytes the flash actor read for `r` (0 when resident).
fn requester_bytes(backend: &Backend, r: Requester) -> u64 {
    backend
        .streamer()
        .map(|s| s.flash.counters().read_bytes[r.index()].load(Ordering::Relaxed))
        .unwrap_or(0)
}

/// Total the run, close telemetry with the trailer, and report (or fail with
/// the cause and the `BMOE_DONE` line of what was generated).
pub(super) fn report(
    a: Assembly,
    telemetry: Telemetry,
    ended: Ended,
) -> Result<RunReport, EngineError> {
    let Assembly {
        ctx,
        backend,
        layout,
        cfg,
        k,
        mut notes,
        tokens,
        prefill: prefill_facts,
        ..
    } = a;
    let prompt_tokens = tokens.len();
    let Ended {
        metered: m,
        head,
        observer_failure,
        aborted_by_hook,
        startup,
    } = ended;
    let elapsed: Duration = m.started.elapsed();
    let stream_failed = observer_failure.is_some();
    if let Some(c) = backend.streamer().and_then(|s| s.faults.as_ref()) {
        notes.push(c.summary());
    }
    let failed = failure(&m.res, observer_failure, aborted_by_hook);
    let interrupted = matches!(&m.res, Ok(g) if g.stop == StopReason::Interrupted);
    let (_, peak_rss) = memory::rss_bytes();
    let spec = m.res.as_ref().map(|g| g.spec).unwrap_or_default();
    // The flash split: what the MTP head's own passes streamed, against the verify decodes.
    let head_read_bytes = requester_bytes(&backend, Requester::Draft);
    let verify_read_bytes = requester_bytes(&backend, Requester::Verify);
    let generated = match &m.res {
        Ok(g) => g.tokens.len(),
        Err(_) => m.rows.len(),
    };
    let mut trailer = Totals {
        rows: &m.rows,
        generated,
        prompt_tokens,
        elapsed,
        decode_span: m.decode_span,
        aborted: failed.is_some() || interrupted,
        dropped_events: telemetry.dropped(),
        peak_rss_bytes: peak_rss,
        spec: &spec,
    }
    .pairs();
    trailer.extend(report::head_pairs(&head, head_read_bytes));
    let prefill = m.res.as_ref().map(|g| g.prefill).unwrap_or_default();
    trailer.extend(startup.trailer_pairs(prefill));
    let prefill_row = m.rows.iter().find(|r| r.prefill);
    let prefill = PrefillReport::new(prefill_row, m.prefill_distinct_bytes, prefill_facts);
    trailer.extend(prefill.pairs());
    let done_line = json_object(&trailer);
    let finished = telemetry.finish(trailer, Duration::from_secs(5));
    if let Some(f) = failed {
        return Err(EngineError::Failed {
            cause: Box::new(cause(m.res, f, stream_failed)),
            done_line,
        });
    }
    if let Err(e) = finished {
        return Err(EngineError::Failed {
            cause: Box::new(e.into()),
            done_line,
        });
    }
    let generation = m.res?;
    let kernel1 = memory::io_read_bytes();
    // The verify hook goes with the context: every decode's trace is flushed.
    drop(ctx);
    if let Some(path) = backend
        .streamer()
        .map(|s| s.commit_route_trace())
        .transpose()?
        .flatten()
    {
        notes.push(format!(
            "route trace: {} (size the cache from it: bmoe replay {} --cache-mb 10%,25%,50%)",
            path.display(),
            path.display()
        ));
    }
    let warm_lines = backend
        .streamer()
        .and_then(|s| s.finish_warm())
        .map(|(line, saved)| vec![line, format!("moe-cache-warm: {saved}")])
        .unwrap_or_default();
    let (reader, budget, flash_bytes, peak_resident) = report::flash_facts(backend.streamer());
    let prefetch = match backend.stream() {
        Some(s) => report::prefetch_report(&s.streamer, &s.cfg, m.predicted),
        None => PrefetchReport::default(),
    };
    Ok(RunReport {
        generation,
        decode_span: m.decode_span,
        speculation: cfg.speculation,
        draft_max: cfg.draft_max,
        head_read_bytes,
        verify_read_bytes,
        head,
        rows: m.rows,
        mode: backend.kind(),
        notes,
        cache_budget_bytes: budget,
        reader,
        flash_read_bytes: flash_bytes,
        kernel_read_bytes: m
            .kernel_read_bytes_before
            .zip(kernel1)
            .map(|(a, b)| b.saturating_sub(a)),
        peak_resident_bytes: peak_resident,
        prefetch,
        warm_lines,
        experts_used: k,
        experts_used_model: layout.n_expert_used,
        drop_cold: backend.drop_cold(),
        peak_rss_bytes: peak_rss,
        dense_bytes: layout.dense_bytes(),
        layout,
        done_line,
        startup,
        prefill,
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

    #[test]
    fn a_hook_error_that_aborted_the_decode_is_the_cause() {
        let res: Result<Generation, GenerateError> = Err(GenerateError::NoLogits);
        let f = failure(&res, Some("read failed".into()), true).expect("a failure");
        assert_eq!(f.to_string(), "streaming stopped the decode: read failed");
        let c = cause(res, f, true);
        assert_eq!(c.to_string(), "streaming stopped the decode: read failed");
    }

    #[test]
    fn without_a_hook_error_the_generation_decides() {
        assert!(failure(&ok(), None, false).is_none());
        // A hook error that did not abort anything is not a failure.
        assert!(failure(&ok(), Some("late".into()), false).is_none());
        let res: Result<Generation, GenerateError> = Err(GenerateError::NoLogits);
        let f = failure(&res, None, false).expect("a failure");
        let c = cause(res, f, false);
        assert!(matches!(c, EngineError::Generate(GenerateError::NoLogits)));
    }
}
