//! Route traces offline, without llama.cpp: the file `--route-trace` writes,
//! other tools' routing logs turned into it, and what a trace says about a
//! cache before any model runs.
//!
//! - [`route_trace`]: the route trace format.
//! - [`trace_import`]: other tools' routing logs (JSONL, arrays, CSV, npy) as route traces.
//! - [`replay`]: a route trace replayed through the cache, and the offline optimum.
//! - [`routing`]: a trace's load skew and token-to-token locality per layer.

pub mod replay;
pub mod route_trace;
pub mod routing;
pub mod trace_import;
