//! The speculation group: `--ngram`, `--mtp`, `--spec` and their settings.
//! Run takes all of it; chat and serve take the n-gram part (`ChatSpecArgs`).

use clap::Args;

use bmoe::engine::{self, DEFAULT_DRAFT, MAX_DRAFT};

/// `--spec`'s draft source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpecSource {
    /// The n-gram matcher when it has a match, else the MTP head (when the
    /// model has one).
    Auto,
    Ngram,
    Mtp,
    Off,
}

/// Self-speculative decoding: a draft source and how many drafts are verified.
#[derive(Debug, Args)]
#[command(next_help_heading = "Speculation")]
#[command(group(clap::ArgGroup::new("speculation").args(["ngram", "mtp", "spec"])))]
pub struct SpecArgs {
    /// Self-speculative decoding with n-gram drafts: the longest earlier match of
    /// the text's suffix proposes what followed it; the model verifies the drafts
    /// in one wider decode and keeps only tokens equal to its own argmax.
    #[arg(long, conflicts_with = "mtp")]
    pub ngram: bool,
    /// Self-speculative decoding with the model's own MTP (nextn) head as the
    /// drafter (a model with nextn layers). The head runs on a draft actor
    /// thread; when streaming, its experts stream too. Not with --rpc.
    #[arg(long, conflicts_with = "rpc")]
    pub mtp: bool,
    /// With --mtp: stop drafting once the head's top probability falls below F.
    /// (clap's `requires` is met by any member of the `speculation` group, so
    /// the pairing is checked after parsing too.)
    #[arg(long, value_name = "F", requires = "mtp")]
    pub mtp_p_min: Option<f32>,
    /// With --mtp and streaming: after drafting, have the flash actor read the
    /// experts of the head's drafting pass in the background while the verify
    /// decode computes (its catch-up routes mostly to them). Off by default: on
    /// a 2-core host it costs the verify decode about what it saves the head.
    #[arg(long, requires = "mtp")]
    pub head_predemand: bool,
    /// Speculation behind a cost gate: before each step, verify only as many
    /// of the source's drafts (0..=--draft) as maximise the expected tokens per
    /// second, from the acceptance, decode cost per batch width and drafting
    /// cost measured so far in this run. ngram or mtp as with --ngram/--mtp
    /// (which verify every draft); auto: the n-gram matcher when it has a
    /// match, else the MTP head when the model has one; off: no speculation
    /// (docs/speculation.md).
    #[arg(long, value_name = "auto|ngram|mtp|off")]
    pub spec: Option<SpecSource>,
    /// Draft width: tokens verified per decode with speculation (1..=8).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DRAFT, requires = "speculation", value_parser = clap::value_parser!(u32).range(1..=MAX_DRAFT as i64))]
    pub draft: u32,
    /// Shortest suffix match that may draft with --ngram.
    /// Default 3.
    #[arg(long, value_name = "M", requires = "ngram", value_parser = clap::value_parser!(u32).range(1..=16))]
    pub ngram_min_match: Option<u32>,
}

impl SpecArgs {
    /// N-gram drafts, ungated (`--ngram`) or gated (`--spec ngram|auto`).
    pub fn uses_ngram(&self) -> bool {
        self.ngram || matches!(self.spec, Some(SpecSource::Ngram | SpecSource::Auto))
    }

    /// MTP drafts, ungated (`--mtp`) or gated (`--spec mtp`, and `--spec auto`
    /// on a model with a head).
    pub fn uses_mtp(&self) -> bool {
        self.mtp || matches!(self.spec, Some(SpecSource::Mtp | SpecSource::Auto))
    }

    /// The engine's speculation settings.
    pub fn config(&self) -> engine::SpecConfig {
        engine::SpecConfig {
            source: self.source(),
            draft_max: self.draft,
            gated: self.spec.is_some(),
        }
    }

    /// N-gram or MTP speculation, both (`--spec auto`), or none (--ngram wins
    /// over --mtp; `--spec` names one of them, gated).
    fn source(&self) -> engine::Speculation {
        let min_match = self
            .ngram_min_match
            .unwrap_or(bmoe_decode::ngram::DEFAULT_MIN_MATCH as u32);
        if self.spec == Some(SpecSource::Auto) {
            return engine::Speculation::Auto {
                min_match,
                p_min: self.mtp_p_min.unwrap_or(0.0),
                predemand: self.head_predemand,
                head: true,
            };
        }
        match (self.uses_ngram(), self.uses_mtp()) {
            (true, _) => engine::Speculation::Ngram { min_match },
            (false, true) => engine::Speculation::Mtp {
                p_min: self.mtp_p_min.unwrap_or(0.0),
                predemand: self.head_predemand,
            },
            (false, false) => engine::Speculation::Off,
        }
    }
}

/// Chat's and serve's speculation: n-gram drafts only, the same flags as
/// run's (the MTP head and the cost gate read the target's hidden states,
/// which one sequence of a context has alone: they are run's).
#[derive(Debug, Args)]
#[command(next_help_heading = "Speculation")]
pub struct ChatSpecArgs {
    /// Self-speculative decoding with n-gram drafts, as `bmoe run --ngram`:
    /// each greedy reply drafts from its prompt's and its own earlier tokens
    /// and keeps only tokens equal to the model's own argmax (a request that
    /// samples, or whose output follows a grammar, goes without).
    #[arg(long)]
    pub ngram: bool,
    /// Draft width: tokens verified per decode with --ngram (1..=8).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DRAFT, requires = "ngram", value_parser = clap::value_parser!(u32).range(1..=MAX_DRAFT as i64))]
    pub draft: u32,
    /// Shortest suffix match that may draft with --ngram.
    /// Default 3.
    #[arg(long, value_name = "M", requires = "ngram", value_parser = clap::value_parser!(u32).range(1..=16))]
    pub ngram_min_match: Option<u32>,
}

impl ChatSpecArgs {
    /// The engine's speculation settings: n-gram drafts, ungated, or none.
    pub fn config(&self) -> engine::SpecConfig {
        let min_match = self
            .ngram_min_match
            .unwrap_or(bmoe_decode::ngram::DEFAULT_MIN_MATCH as u32);
        engine::SpecConfig {
            source: match self.ngram {
                true => engine::Speculation::Ngram { min_match },
                false => engine::Speculation::Off,
            },
            draft_max: self.draft,
            gated: false,
        }
    }
}
