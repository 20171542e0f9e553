//! The measurement harness: bench matrices (cells, presets, the runner of
//! interleaved rounds, the probe of the host's bound), host conditions read
//! from `/proc` and the flags they raise, `bmoe compare` over telemetry CSVs,
//! and the end-to-end tables of a bench's summary.
//!
//! The boundary: the lab may use the engine (its layout, its memory facts,
//! the flash actor's read probe, child `bmoe run` processes), never the other
//! way. No module of the engine imports `lab`; only the binary's CLI and the
//! tests do (checked by tests/integration/architecture.rs).

pub mod bench;
pub mod compare;
