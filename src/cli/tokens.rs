//! `-n/--n-predict`, the one length flag of every command that generates:
//! run, chat and serve flatten it into their own groups.

use clap::Args;

use bmoe::engine::DEFAULT_N_PREDICT;

/// How many tokens a job may generate.
#[derive(Debug, Args)]
pub struct TokensArg {
    /// The most tokens to generate, at least 1: a run's continuation, each
    /// chat reply, a server request without `max_tokens`. Generation stops
    /// earlier at end of text; the context's room caps it too.
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = DEFAULT_N_PREDICT, value_parser = clap::value_parser!(u32).range(1..))]
    pub n_predict: u32,
}
