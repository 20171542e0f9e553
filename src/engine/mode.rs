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

/// The run mode a configuration asks for, before the model's layout and the
/// memory decide ([`super::RunConfig::check_against`], `engine::fits`): one
/// field for resident, streamed (and how firmly), or bmoe's choice.
#[derive(Debug, Clone, PartialEq)]
pub enum Asked {
    /// `--resident`: llama.cpp's own mmap path.
    Resident,
    /// `--moe-stream`: streamed even when the file fits; a dense model is refused.
    Stream(StreamConfig),
    /// Another streaming flag, or a caller that chose streaming: streamed; a
    /// dense model runs resident, said.
    StreamMoe(StreamConfig),
    /// No streaming flag: resident when the model file fits in the memory
    /// the run may use, else streamed with these settings.
    Auto(StreamConfig),
}

impl Asked {
    /// The streaming settings, when streaming may be the mode.
    pub fn stream(&self) -> Option<&StreamConfig> {
        match self {
            Asked::Resident => None,
            Asked::Stream(s) | Asked::StreamMoe(s) | Asked::Auto(s) => Some(s),
        }
    }

    /// [`Self::stream`], owned.
    pub fn into_stream(self) -> Option<StreamConfig> {
        match self {
            Asked::Resident => None,
            Asked::Stream(s) | Asked::StreamMoe(s) | Asked::Auto(s) => Some(s),
        }
    }

    /// Streamed whether or not the file fits (what reads the streamed
    /// experts, such as `--head-predemand`, needs): bmoe's choice becomes streaming.
    pub fn always_stream(self) -> Self {
        match self {
            Asked::Auto(s) => Asked::StreamMoe(s),
            other => other,
        }
    }
}

/// A caller that sets the mode itself: resident, or streamed (a dense model
/// then runs resident).
impl From<Mode> for Asked {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Resident => Asked::Resident,
            Mode::Stream(s) => Asked::StreamMoe(s),
        }
    }
}
