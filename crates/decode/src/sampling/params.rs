//! What a sampled (non-greedy) generation draws with: the settings of
//! llama.cpp's sampler chain, checked before a model is loaded.

/// The sampler settings. Temperature 0 is greedy (the argmax, the engine's
/// default and the only mode speculation keeps exact); every other field is
/// then unused.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 = greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: u32,
    /// Keep the smallest set whose probability reaches p (1 = off).
    pub top_p: f32,
    /// Drop tokens below p x the top token's probability (0 = off).
    pub min_p: f32,
    /// Divide repeated tokens' logits by this (1 = off).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at (0 = off).
    pub repeat_last_n: u32,
    /// Subtract this from every token seen at least once (0 = off).
    pub presence_penalty: f32,
    /// Subtract this times the count of each token seen (0 = off).
    pub frequency_penalty: f32,
    /// The draw's seed: the same seed, prompt and settings give the same text.
    pub seed: u32,
}

/// The seed when none is given.
pub const DEFAULT_SEED: u32 = 0x5EED;
/// The penalties' window when none is given (llama.cpp's default).
pub const DEFAULT_REPEAT_LAST_N: u32 = 64;

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: DEFAULT_REPEAT_LAST_N,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: DEFAULT_SEED,
        }
    }
}

impl SamplingParams {
    /// Temperature 0: the argmax, no draw.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Any penalty that changes logits.
    pub fn has_penalties(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }

    /// The first setting out of range, as `(name, why)`: names are the
    /// settings' generic names; the CLI and the server say them in their own terms.
    pub fn check(&self) -> Result<(), (&'static str, &'static str)> {
        let finite = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repeat_penalty", self.repeat_penalty),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ];
        if let Some((name, _)) = finite.iter().find(|(_, v)| !v.is_finite()) {
            return Err((name, "must be a finite number"));
        }
        if !(0.0..=100.0).contains(&self.temperature) {
            return Err(("temperature", "must be in 0..=100 (0 is greedy)"));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(("top_p", "must be in (0, 1] (1 is off)"));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(("min_p", "must be in 0..=1 (0 is off)"));
        }
        if self.repeat_penalty <= 0.0 {
            return Err(("repeat_penalty", "must be above 0 (1 is off)"));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(("presence_penalty", "must be in -2..=2 (0 is off)"));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(("frequency_penalty", "must be in -2..=2 (0 is off)"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_greedy_and_valid() {
        let p = SamplingParams::default();
        assert!(p.is_greedy());
        assert!(!p.has_penalties());
        assert_eq!(p.check(), Ok(()));
    }

    #[test]
    fn out_of_range_settings_are_named() {
        let bad = |f: fn(&mut SamplingParams)| {
            let mut p = SamplingParams::default();
            f(&mut p);
            p.check().unwrap_err().0
        };
        assert_eq!(bad(|p| p.temperature = -0.5), "temperature");
        assert_eq!(bad(|p| p.temperature = f32::NAN), "temperature");
        assert_eq!(bad(|p| p.top_p = 0.0), "top_p");
        assert_eq!(bad(|p| p.min_p = 1.5), "min_p");
        assert_eq!(bad(|p| p.repeat_penalty = 0.0), "repeat_penalty");
        assert_eq!(bad(|p| p.presence_penalty = 3.0), "presence_penalty");
        assert_eq!(
            bad(|p| p.frequency_penalty = f32::INFINITY),
            "frequency_penalty"
        );
    }

    #[test]
    fn penalties_need_a_window_and_a_value() {
        let mut p = SamplingParams {
            repeat_penalty: 1.1,
            ..Default::default()
        };
        assert!(p.has_penalties());
        p.repeat_last_n = 0;
        assert!(!p.has_penalties());
    }
}
