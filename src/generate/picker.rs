//! Picking a token from a row of logits: greedy, or a seeded draw through
//! llama.cpp's sampler chain, never a banned end-of-generation token.

use bmoe_decode::sampling::{argmax, argmax_where, SamplingParams};

use super::error::GenerateError;
use crate::llama::{Context, Grammar, Model, Sampler, Token};

/// The choice from a row of logits: the argmax, or a draw through
/// llama.cpp's sampler chain; never an end-of-generation token under `--ignore-eos`.
pub(crate) struct Picker {
    /// End-of-generation tokens, sorted (empty unless they are banned).
    banned: Vec<Token>,
    /// The sampled mode's chain (None: greedy).
    pub(super) sampler: Option<Sampler>,
}

impl Picker {
    pub(crate) fn new(
        model: &Model,
        ignore_eos: bool,
        sampling: &SamplingParams,
        prompt: &[Token],
        grammar: Option<&Grammar>,
    ) -> Result<Self, GenerateError> {
        let banned = if ignore_eos {
            (0..model.n_vocab() as Token)
                .filter(|&t| model.is_eog(t))
                .collect()
        } else {
            Vec::new()
        };
        // A grammar goes through the chain even when greedy: at temperature
        // 0 the chain picks the argmax of what the grammar allows.
        let sampler = if sampling.is_greedy() && grammar.is_none() {
            None
        } else {
            let mut s = Sampler::with_grammar(model, sampling, grammar)?;
            // The penalties see the prompt's last tokens, as llama.cpp's own tools do.
            let window = prompt.len().saturating_sub(sampling.repeat_last_n as usize);
            prompt[window..].iter().for_each(|&t| s.accept(t));
            Some(s)
        };
        Ok(Self { banned, sampler })
    }

    /// The token for logits row `i` of the last decode (among allowed tokens).
    pub(crate) fn pick(&mut self, ctx: &Context, i: i32) -> Result<Token, GenerateError> {
        let logits = checked(ctx.logits(i).ok_or(GenerateError::NoLogits)?)?;
        if let Some(s) = self.sampler.as_mut() {
            let stuck = if s.has_grammar() {
                GenerateError::GrammarDeadEnd
            } else {
                GenerateError::NoLogits
            };
            return s.sample(logits, &self.banned).ok_or(stuck);
        }
        let best = argmax(logits).ok_or(GenerateError::NoLogits)? as Token;
        if self.banned.binary_search(&best).is_err() {
            return Ok(best);
        }
        // Rare: the best token ends generation; take the best allowed one.
        argmax_where(logits, |t| {
            self.banned.binary_search(&(t as Token)).is_err()
        })
        .map(|t| t as Token)
        .ok_or(GenerateError::NoLogits)
    }
}

/// One position's logits, refused when any is NaN: weights that are corrupt
/// compute NaN, and a pick among the rest would be garbage said as text.
fn checked(logits: &[f32]) -> Result<&[f32], GenerateError> {
    if logits.iter().any(|x| x.is_nan()) {
        return Err(GenerateError::NanLogits);
    }
    Ok(logits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_logits_are_refused_as_a_corrupt_model_not_picked_around() {
        assert!(checked(&[0.5, f32::NEG_INFINITY, 2.0]).is_ok());
        let e = checked(&[0.5, f32::NAN, 2.0]).unwrap_err();
        assert!(matches!(e, GenerateError::NanLogits));
        assert!(e.to_string().contains("corrupt"), "{e}");
    }
}
