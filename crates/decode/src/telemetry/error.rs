//! What can go wrong writing telemetry.

use std::path::PathBuf;
use std::time::Duration;

/// Errors of the telemetry actor.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot write the CSV {path}: {source} (choose a writable --csv path)")]
    Csv {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "writing BMOE_PROGRESS lines to stdout failed: {0} (the reader closed the pipe, or the \
         disk is full); generation stopped there"
    )]
    Progress(#[source] std::sync::Arc<std::io::Error>),
    #[error(
        "writing the CSV {path} failed during the run: {source}; generation stopped there \
         (the rows before the failure are in the file)"
    )]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the telemetry actor did not stop within {0:?}")]
    Timeout(Duration),
}
