//! What `GET /metrics` reports, in Prometheus' text format through the
//! `metrics` crate and its Prometheus exporter (no HTTP listener of its own:
//! the server renders it on its route).

use std::time::Duration;

use metrics::{counter, gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use super::job::Done;
use super::sink::JobSink;
use crate::engine::TurnFigures;
use crate::generate::Step;

/// Install the process-wide recorder; the handle renders the text format.
pub(crate) fn install() -> Result<PrometheusHandle, String> {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| e.to_string())?;
    Ok(handle)
}

/// A finished request, by route and status.
pub(crate) fn request(route: &'static str, status: u16) {
    counter!("bmoe_requests_total", "route" => route, "status" => status.to_string()).increment(1);
}

/// Requests waiting for the engine.
pub(crate) fn queue_depth(n: usize) {
    gauge!("bmoe_queue_depth").set(n as f64);
}

/// A generation stopped because its client went away.
pub(crate) fn cancelled() {
    counter!("bmoe_requests_cancelled_total").increment(1);
}

/// Requests refused because the queue was full.
pub(crate) fn rejected() {
    counter!("bmoe_requests_rejected_total").increment(1);
}

/// Sequences generating now (at most `--parallel`).
pub(crate) fn slots_busy(n: usize) {
    gauge!("bmoe_slots_busy").set(n as f64);
}

/// One decode of the generations in flight: what it streamed.
pub(crate) fn decoded(step: &Step<JobSink>) {
    let s = &step.metrics;
    counter!("bmoe_decodes_total").increment(1);
    counter!("bmoe_decode_rows_total").increment(step.rows as u64);
    counter!("bmoe_decode_sequences_total").increment(step.sequences as u64);
    counter!("bmoe_flash_read_bytes_total").increment(s.read_bytes);
    counter!("bmoe_cache_hits_total").increment(s.hits);
    counter!("bmoe_cache_misses_total").increment(s.misses);
    // Seconds are fractional: a gauge that only grows.
    gauge!("bmoe_stall_seconds_total").increment(s.stall.as_secs_f64());
}

/// A job's prompt: tokens put back from the prompt cache and tokens decoded.
pub(crate) fn prompt_split(restored: usize, prefilled: u64) {
    counter!("bmoe_prompt_tokens_restored_total").increment(restored as u64);
    counter!("bmoe_prompt_tokens_prefilled_total").increment(prefilled);
}

/// The prompt cache's bytes read from and written to disk so far.
pub(crate) fn prompt_cache_bytes(read: u64, written: u64) {
    counter!("bmoe_prompt_cache_read_bytes_total").absolute(read);
    counter!("bmoe_prompt_cache_written_bytes_total").absolute(written);
}

/// A job's figures (its share of the flash bytes under its requester), and
/// the session's running ones.
pub(crate) fn finished(done: &Done, requester: &str, wall: Duration, session: &TurnFigures) {
    let f = &done.figures;
    counter!("bmoe_prompt_tokens_total").increment(done.prompt_tokens as u64);
    counter!("bmoe_prompt_tokens_reused_total").increment(f.reused_tokens);
    counter!("bmoe_generated_tokens_total").increment(f.generated_tokens);
    let who = requester.to_string();
    counter!("bmoe_requester_flash_read_bytes_total", "requester" => who.clone())
        .increment(f.metrics.read_bytes);
    counter!("bmoe_requester_generated_tokens_total", "requester" => who)
        .increment(f.generated_tokens);
    gauge!("bmoe_request_seconds_last").set(wall.as_secs_f64());
    gauge!("bmoe_decode_tokens_per_second_last").set(f.decode_tok_s());
    gauge!("bmoe_decode_tokens_per_second").set(session.decode_tok_s());
    if let Some(h) = session.hit_pct() {
        gauge!("bmoe_cache_hit_percent").set(h);
    }
}
