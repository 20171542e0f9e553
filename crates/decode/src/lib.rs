//! The per-token loop's parts that need no llama.cpp: every function takes
//! plain data, so this crate builds and tests in seconds.
//!
//! - [`sampling`]: greedy selection over a logits row, and the sampler settings.
//! - [`ngram`]: the n-gram draft source (longest earlier match of the suffix).
//! - [`spec_gate`]: the speculation gate (how far to draft this step, from measured costs).
//! - [`text`]: streaming detokenization (UTF-8 reassembly across tokens) and stop strings.
//! - [`metrics`]: what one decode's streaming cost, from the hook to the telemetry row.
//! - [`telemetry`]: the telemetry actor, writing one CSV row per token.

pub mod metrics;
pub mod ngram;
pub mod sampling;
pub mod spec_gate;
pub mod telemetry;
pub mod text;
