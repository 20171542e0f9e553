//! The compute term from resident decodes of the model cut to fewer blocks
//! (`inspect --forecast --compute-probe depth`): per-token time is fixed
//! (embedding, output matrix, sampling, the loop) plus a per-block cost, so
//! two depths give both and the full depth's time follows. Resident, a
//! decode reads nothing from flash: the time is compute alone, with the
//! engine's and llama.cpp's real costs in it (which the kernel model of one
//! product and one segment per layer put at a half or less on real shapes).

/// One cut model's resident decode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DepthSample {
    pub blocks: u32,
    /// Tokens timed.
    pub tokens: u32,
    /// Seconds per generated token.
    pub token_s: f64,
}

/// Per-token time against depth, from two or more depths.
#[derive(Debug, Clone, PartialEq)]
pub struct DepthFit {
    pub samples: Vec<DepthSample>,
    /// Seconds per token at no block (the intercept, at least 0).
    pub fixed_s: f64,
    /// Seconds per token per block (the slope, at least 0).
    pub per_block_s: f64,
    /// The model's full depth (its main blocks, no MTP block).
    pub full_blocks: u32,
}

impl DepthFit {
    /// Least squares over `samples` (at least two distinct depths), each
    /// term clamped at 0 (timing noise on a tiny model can tip one below).
    pub fn of(samples: &[DepthSample], full_blocks: u32) -> Option<DepthFit> {
        let n = samples.len() as f64;
        let mx = samples.iter().map(|s| f64::from(s.blocks)).sum::<f64>() / n;
        let my = samples.iter().map(|s| s.token_s).sum::<f64>() / n;
        let sxx: f64 = samples
            .iter()
            .map(|s| (f64::from(s.blocks) - mx).powi(2))
            .sum();
        if samples.len() < 2 || sxx <= 0.0 {
            return None;
        }
        let sxy: f64 = samples
            .iter()
            .map(|s| (f64::from(s.blocks) - mx) * (s.token_s - my))
            .sum();
        let per_block_s = (sxy / sxx).max(0.0);
        let fixed_s = (my - per_block_s * mx).max(0.0);
        Some(DepthFit {
            samples: samples.to_vec(),
            fixed_s,
            per_block_s,
            full_blocks,
        })
    }

    /// Seconds per token at the model's full depth: the forecast's compute term.
    pub fn compute_s(&self) -> f64 {
        self.fixed_s + self.per_block_s * f64::from(self.full_blocks)
    }

    /// Whether the fit measured a cost per block: a deeper cut that ran no
    /// slower (this host's timing noise) gives no slope to scale by, and
    /// its full depth would be the fixed term alone.
    pub fn usable(&self) -> bool {
        self.per_block_s > 0.0
    }

    /// The forecast table's line.
    pub fn line(&self) -> String {
        let samples: Vec<String> = self
            .samples
            .iter()
            .map(|s| {
                format!(
                    "{} blocks {:.2} ms/token ({} tokens)",
                    s.blocks,
                    s.token_s * 1e3,
                    s.tokens
                )
            })
            .collect();
        let verdict = match self.usable() {
            true => "the cells below use it",
            false => {
                "not used: the deeper cut ran no slower (timing noise; run it again, or use more \
                 --depth-blocks)"
            }
        };
        format!(
            "  compute probe:  resident decodes of the model cut to {}: fixed {:.2} ms + {:.3} ms \
             a block x {} blocks = compute {:.1} ms/token: {verdict}\n",
            samples.join(", "),
            self.fixed_s * 1e3,
            self.per_block_s * 1e3,
            self.full_blocks,
            self.compute_s() * 1e3
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(blocks: u32, ms: f64) -> DepthSample {
        DepthSample {
            blocks,
            tokens: 8,
            token_s: ms / 1e3,
        }
    }

    #[test]
    fn two_depths_give_the_line_and_it_scales_to_full_depth() {
        // 10 ms fixed + 5 ms a block: 20 ms at 2 blocks, 30 at 4; 48 blocks: 250 ms.
        let f = DepthFit::of(&[s(2, 20.0), s(4, 30.0)], 48).expect("a fit");
        assert!((f.fixed_s - 0.010).abs() < 1e-12, "{f:?}");
        assert!((f.per_block_s - 0.005).abs() < 1e-12, "{f:?}");
        assert!((f.compute_s() - 0.250).abs() < 1e-12, "{f:?}");
        let line = f.line();
        assert!(line.contains("2 blocks 20.00 ms/token"), "{line}");
        assert!(line.contains("4 blocks 30.00 ms/token"), "{line}");
        assert!(line.contains("compute 250.0 ms/token"), "{line}");
        assert!(
            f.usable() && line.contains("the cells below use it"),
            "{line}"
        );
    }

    #[test]
    fn more_depths_are_least_squares_and_noise_never_goes_negative() {
        let f = DepthFit::of(&[s(1, 15.0), s(2, 20.0), s(3, 25.0)], 10).expect("a fit");
        assert!((f.compute_s() - 0.060).abs() < 1e-12, "{f:?}");
        // Deeper measured faster (noise): no negative cost per block.
        let f = DepthFit::of(&[s(2, 20.0), s(4, 19.0)], 48).expect("a fit");
        assert_eq!(f.per_block_s, 0.0);
        assert!((f.compute_s() - 0.0195).abs() < 1e-12, "{f:?}");
        assert!(!f.usable(), "no slope to scale by");
        assert!(f.line().contains("not used: the deeper cut ran no slower"));
        // A steep slope cannot push the intercept below 0.
        let f = DepthFit::of(&[s(2, 5.0), s(4, 30.0)], 8).expect("a fit");
        assert_eq!(f.fixed_s, 0.0);
        // One depth is no line.
        assert!(DepthFit::of(&[s(2, 20.0)], 48).is_none());
        assert!(DepthFit::of(&[s(2, 20.0), s(2, 21.0)], 48).is_none());
    }
}
