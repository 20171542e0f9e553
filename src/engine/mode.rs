//! The run mode: resident, or streamed with what the stage carries.

use crate::stream::StreamConfig;

/// How expert weights reach the matmuls: the one encoding of the run mode.
/// What streaming carries depends on the stage: the settings asked for
/// (`Mode<StreamConfig>`, the default), the running streamer with them
/// (`Mode<Streaming>`, the engine's backend), nothing (`Mode<()>`, what a
/// report keeps).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode<S = StreamConfig> {
    /// llama.cpp's own mmap path (the comparison baseline).
    Resident,
    /// Experts streamed by the flash actor (a MoE model given a streaming
    /// flag, or whose file does not fit in memory: `engine::fits`).
    Stream(S),
}

impl<S> Mode<S> {
    /// The name in the CSV preamble and the summary (`resident`, `stream`).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Mode::Resident => "resident",
            Mode::Stream(_) => "stream",
        }
    }

    /// What streaming carries, when streamed.
    pub(crate) fn stream(&self) -> Option<&S> {
        match self {
            Mode::Resident => None,
            Mode::Stream(s) => Some(s),
        }
    }

    /// The mode alone, without what streaming carries.
    pub(crate) fn kind(&self) -> Mode<()> {
        match self {
            Mode::Resident => Mode::Resident,
            Mode::Stream(_) => Mode::Stream(()),
        }
    }
}

impl<S> std::fmt::Display for Mode<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl<S> PartialEq<&str> for Mode<S> {
    fn eq(&self, name: &&str) -> bool {
        self.name() == *name
    }
}
