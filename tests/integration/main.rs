//! bmoe's integration tests: one test binary (links llama.cpp once), real gguf
//! files built by bmoe's own fixtures.

mod agents;
mod architecture;
mod bench;
mod cache_warm;
mod chat;
mod common;
mod constrained;
mod errors;
mod eval_hook;
mod faults;
mod fixtures;
mod gguf_fuzz;
mod interrupts;
mod link;
mod load;
mod netns;
mod outputs;
mod prefetch;
mod prefill;
mod replay;
mod rpc;
mod run;
mod sampling;
mod serve;
mod serve_dialects;
mod serve_load;
mod serve_requests;
mod shapes;
mod speculation;
mod split;
mod stream;
mod telemetry;
mod tracing;
mod zoo;
