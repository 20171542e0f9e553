//! Token selection: greedy over a logits row here, the sampled mode's settings in [`params`].

mod params;

pub use params::{SamplingParams, DEFAULT_REPEAT_LAST_N, DEFAULT_SEED};

/// Index of the largest logit; ties go to the lowest index (llama.cpp's greedy
/// sampler does the same), NaN never wins. `None` for an empty row.
pub fn argmax(logits: &[f32]) -> Option<usize> {
    argmax_where(logits, |_| true)
}

/// [`argmax`] over the indices `allowed` accepts (the first of ties, NaN skipped).
pub fn argmax_where(logits: &[f32], allowed: impl Fn(usize) -> bool) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_nan() || !allowed(i) {
            continue;
        }
        match best {
            Some((_, b)) if v <= b => {}
            _ => best = Some((i, v)),
        }
    }
    best.map(|(i, _)| i)
}

/// The gap between the largest and the second largest logit (for near-tie checks).
pub fn top2_gap(logits: &[f32]) -> Option<f32> {
    let mut a = f32::NEG_INFINITY;
    let mut b = f32::NEG_INFINITY;
    for &v in logits.iter().filter(|v| !v.is_nan()) {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    (b > f32::NEG_INFINITY).then_some(a - b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_picks_first_of_ties_and_skips_nan() {
        assert_eq!(argmax(&[]), None);
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f32::NAN, -1.0, -2.0]), Some(1));
        let logits = [1.0, 3.0, 3.0, 2.0];
        assert_eq!(argmax_where(&logits, |i| i != 1), Some(2));
        assert_eq!(argmax_where(&logits, |i| i == 0), Some(0));
        assert_eq!(argmax_where(&logits, |_| false), None);
        assert_eq!(argmax(&[f32::NAN]), None);
    }

    #[test]
    fn gap_between_top_two() {
        assert_eq!(top2_gap(&[1.0]), None);
        assert_eq!(top2_gap(&[1.0, 4.0, 2.5]), Some(1.5));
    }
}
