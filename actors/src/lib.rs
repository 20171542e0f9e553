//! bmoe's actors and pure policy. Nothing here links llama.cpp: every function
//! takes plain data, so this crate builds and tests in seconds.
//!
//! - [`sampling`]: greedy selection over a logits row.
//! - [`ngram`]: the n-gram draft source (longest earlier match of the suffix).
//! - [`text`]: streaming detokenization (UTF-8 reassembly across tokens).
//! - [`output`]: output files written beside their target and renamed into place.
//! - [`proj`]: the three projections of an expert, shared with the model layout.
//! - [`metrics`]: what one decode's streaming cost, from the hook to the telemetry row.
//! - [`cache`]: the expert cache's state machine and eviction policies.
//! - [`route_trace`]: the route trace format (`--route-trace`).
//! - [`replay`]: a route trace replayed through the cache, and the offline optimum.
//! - [`trace_import`]: other tools' routing logs (JSONL, arrays, CSV) as route traces.
//! - [`routing`]: a trace's load skew and token-to-token locality per layer.
//! - [`spec_gate`]: the speculation gate (how far to draft this step, from measured costs).
//! - [`xorshift`]: a tiny seeded generator for the probe and property tests.

pub mod cache;
pub mod flash;
pub mod metrics;
pub mod ngram;
pub mod output;
pub mod proj;
pub mod replay;
pub mod route_trace;
pub mod routing;
pub mod sampling;
pub mod spec_gate;
pub mod telemetry;
pub mod text;
pub mod trace_import;
pub mod warm_profile;
pub mod xorshift;
