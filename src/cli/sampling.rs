//! The sampling group run, chat and serve take (serve: its requests'
//! defaults), and its checks: settings in range, and speculation only with
//! greedy picks.

use clap::Args;

use bmoe_decode::sampling::{SamplingParams, DEFAULT_REPEAT_LAST_N, DEFAULT_SEED};

use super::usage::UsageError;

/// Sampling through llama.cpp's sampler chain (greedy unless --temp > 0);
/// serve's requests' defaults.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Sampling")]
pub struct SamplingArgs {
    /// Sampling temperature: 0 (the default) picks the most likely token
    /// (greedy, the only mode speculation keeps exact); above 0 draws through
    /// llama.cpp's sampler chain with the settings below.
    #[arg(long = "temp", value_name = "T", default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the K most likely tokens before drawing (0 = off).
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub top_k: u32,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens less likely than P x the most likely one (0 = off).
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub min_p: f32,
    /// Divide the logits of recently seen tokens by F (1 = off).
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens (prompt included) the penalties look at.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_REPEAT_LAST_N)]
    pub repeat_last_n: u32,
    /// Subtract F from the logit of every recently seen token (-2..=2, 0 = off).
    #[arg(
        long,
        value_name = "F",
        default_value_t = 0.0,
        allow_hyphen_values = true
    )]
    pub presence_penalty: f32,
    /// Subtract F x its count from each recently seen token's logit (-2..=2, 0 = off).
    #[arg(
        long,
        value_name = "F",
        default_value_t = 0.0,
        allow_hyphen_values = true
    )]
    pub frequency_penalty: f32,
    /// Seed of the draw: the same seed, prompt and settings give the same text.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SEED)]
    pub seed: u32,
}

impl SamplingArgs {
    /// The sampler settings, checked.
    pub fn params(&self) -> Result<SamplingParams, UsageError> {
        let p = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
        };
        p.check()
            .map_err(|(name, why)| UsageError(format!("--{}: {why}", flag_of(name))))?;
        Ok(p)
    }

    /// Refuse a draw with speculation, which keeps only the target's argmax.
    pub fn check_speculation(&self, speculating: bool) -> Result<(), UsageError> {
        if speculating && self.temperature != 0.0 {
            return Err(UsageError(format!(
                "--temp {} draws tokens, but speculation keeps only tokens equal to the \
                 model's most likely one: drop --ngram/--mtp/--spec or use --temp 0",
                self.temperature
            )));
        }
        Ok(())
    }
}

/// The flag of a [`SamplingParams`] field.
fn flag_of(name: &str) -> String {
    match name {
        "temperature" => "temp".into(),
        other => other.replace('_', "-"),
    }
}
