//! What the streamer tells the run's summary, typed where it is decided and
//! rendered by [`std::fmt::Display`].

use std::fmt;

use bmoe_flash::ReaderNote;

/// A fallback or a skipped step of the streamer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamNote {
    /// The flash reader's own (O_DIRECT refused, no io_uring, injected faults).
    Reader(ReaderNote),
    /// `--cache-warm` found the flash actor busy and read nothing ahead.
    WarmBusy,
}

impl fmt::Display for StreamNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Reader(n) => n.fmt(f),
            Self::WarmBusy => {
                f.write_str("--cache-warm: the flash actor was busy; nothing read ahead")
            }
        }
    }
}
