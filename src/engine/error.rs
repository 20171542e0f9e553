//! The engine's one error type, typed across every seam it meets.

use super::refusal::Refusal;
use crate::draft::DraftError;
use crate::generate::GenerateError;
use crate::llama::{LlamaError, ObserverFailure};
use crate::stream::StreamError;
use bmoe_decode::telemetry::TelemetryError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Llama(#[from] LlamaError),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Draft(#[from] DraftError),
    #[error("streaming stopped the decode: {0}")]
    Streaming(#[source] ObserverFailure),
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    #[error(transparent)]
    PromptCache(#[from] crate::prompt_cache::PromptCacheError),
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    StateWrite(#[from] super::state_error::StateWriteError),
    #[error(
        "the model computed NaN for the next token's scores: tensor data is likely corrupt, in \
         the model file here or in what the RPC hosts {} hold; restart their `bmoe rpc-server` \
         (with --cache it checks its files at start and removes damaged ones), and check the \
         model file against its published checksum",
        .endpoints.join(",")
    )]
    NanWithRpc { endpoints: Vec<String> },
    /// A run that failed after generation started: the cause, and the
    /// `BMOE_DONE` object of what was generated (aborted=1), so the binary can
    /// still print it.
    #[error("{cause}")]
    Failed {
        cause: Box<EngineError>,
        done_line: String,
    },
}

impl EngineError {
    /// A refusal: the configuration cannot run and other arguments would fix
    /// it (a prompt longer than the context, streaming a dense model, a cache
    /// that does not fit, a flag the model cannot honour, a damaged warm
    /// profile, an unwritable `--csv`, a bad combination of settings). Every
    /// command that runs the engine exits with the usage code for these.
    pub fn is_refusal(&self) -> bool {
        match self {
            EngineError::Refused(_)
            | EngineError::Generate(GenerateError::PromptTooLong { .. })
            | EngineError::Generate(GenerateError::EmptyPrompt)
            | EngineError::Stream(
                StreamError::NotMoe { .. }
                | StreamError::UnknownLayout { .. }
                | StreamError::CacheTooLarge { .. }
                | StreamError::PredictUnsupported(_)
                | StreamError::Warm(_),
            )
            | EngineError::Telemetry(TelemetryError::Csv { .. }) => true,
            EngineError::Failed { cause, .. } => cause.is_refusal(),
            EngineError::Generate(GenerateError::Template(t)) => t.is_bad_input(),
            _ => false,
        }
    }
}
