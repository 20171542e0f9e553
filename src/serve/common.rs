//! The settings every dialect's body maps to (OpenAI's names: `max_tokens`,
//! `temperature`, `stop`, ...), checked into a [`JobSpec`] over the server's
//! sampling defaults. Each dialect reads its own names into a [`Common`] and
//! calls [`Common::into_spec`].

use serde::Deserialize;

use bmoe_decode::sampling::SamplingParams;

use super::error::ApiError;
use super::job::{
    Constraint, JobSpec, PromptSpec, ANONYMOUS, MAX_STOP_STRINGS, REQUESTER_MAX_CHARS,
};

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum StopIn {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub(crate) include_usage: bool,
}

/// The fields both endpoints share (unknown fields are ignored, as OpenAI's
/// clients send some this server has no use for), read from the body beside
/// the route's own.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Common {
    pub(crate) max_tokens: Option<i64>,
    pub(crate) max_completion_tokens: Option<i64>,
    pub(crate) temperature: Option<f32>,
    pub(crate) top_p: Option<f32>,
    pub(crate) top_k: Option<i64>,
    pub(crate) min_p: Option<f32>,
    pub(crate) presence_penalty: Option<f32>,
    pub(crate) frequency_penalty: Option<f32>,
    pub(crate) repeat_penalty: Option<f32>,
    pub(crate) seed: Option<i64>,
    pub(crate) stop: Option<StopIn>,
    #[serde(default)]
    pub(crate) stream: bool,
    pub(crate) stream_options: Option<StreamOptions>,
    pub(crate) n: Option<i64>,
    /// Who asks (OpenAI's end-user id): the `requester` label of the
    /// per-requester metrics.
    pub(crate) user: Option<String>,
}

impl Common {
    pub(crate) fn into_spec(
        self,
        prompt: PromptSpec,
        defaults: &SamplingParams,
    ) -> Result<JobSpec, ApiError> {
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::invalid(
                Some("n"),
                format!("n = {n}: this server returns one choice per request (n = 1)"),
            ));
        }
        let sampling = self.sampling(defaults)?;
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => None,
            Some(m) if m >= 1 => Some(m.min(u32::MAX as i64) as u32),
            Some(m) => {
                return Err(ApiError::invalid(
                    Some("max_tokens"),
                    format!("max_tokens = {m}: give at least 1"),
                ))
            }
        };
        let stop = match self.stop {
            None => Vec::new(),
            Some(StopIn::One(s)) => vec![s],
            Some(StopIn::Many(v)) => v,
        };
        if stop.len() > MAX_STOP_STRINGS {
            return Err(ApiError::invalid(
                Some("stop"),
                format!(
                    "{} stop strings: give at most {MAX_STOP_STRINGS}",
                    stop.len()
                ),
            ));
        }
        Ok(JobSpec {
            prompt,
            sampling,
            stop,
            max_tokens,
            stream: self.stream,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            requester: requester(self.user.as_deref()),
            count_only: false,
            constraint: Constraint::None,
        })
    }

    /// The server's defaults with the request's settings over them.
    fn sampling(&self, defaults: &SamplingParams) -> Result<SamplingParams, ApiError> {
        let top_k = match self.top_k {
            Some(k) if !(0..=u32::MAX as i64).contains(&k) => {
                return Err(ApiError::invalid(
                    Some("top_k"),
                    format!("top_k = {k}: give 0 (off) or more"),
                ))
            }
            k => k.map(|k| k as u32),
        };
        let seed = match self.seed {
            Some(s) if !(0..=u32::MAX as i64).contains(&s) => {
                return Err(ApiError::invalid(
                    Some("seed"),
                    format!("seed = {s}: give 0..=4294967295"),
                ))
            }
            Some(s) => s as u32,
            // Unseeded draws differ from request to request, as OpenAI's do.
            None if self.temperature.is_some_and(|t| t > 0.0) || !defaults.is_greedy() => {
                fresh_seed()
            }
            None => defaults.seed,
        };
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_k: top_k.unwrap_or(defaults.top_k),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(defaults.repeat_penalty),
            repeat_last_n: defaults.repeat_last_n,
            presence_penalty: self.presence_penalty.unwrap_or(defaults.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(defaults.frequency_penalty),
            seed,
        };
        p.check()
            .map_err(|(name, why)| ApiError::invalid(Some(name), format!("{name} {why}")))?;
        Ok(p)
    }
}

/// A seed from the clock, for requests that give none.
fn fresh_seed() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ d.as_secs() as u32)
        .unwrap_or(0);
    nanos.wrapping_mul(0x9E37_79B9)
}

/// The metrics label for a request's `user`.
fn requester(user: Option<&str>) -> String {
    match user.map(str::trim) {
        Some(u) if !u.is_empty() => u.chars().take(REQUESTER_MAX_CHARS).collect(),
        _ => ANONYMOUS.to_string(),
    }
}
