//! The n-gram draft source: a pure function over token ids (no model, no
//! draft context).
//!
//! The corpus is everything the target has confirmed so far: the prompt,
//! every generated token, and the token just confirmed. The pattern is the
//! corpus's suffix. Every position strictly before the corpus end is a
//! candidate match end (so the pattern never matches itself); a candidate's
//! score is the length of the common suffix of `corpus[..=end]` and the
//! corpus, capped at `max_match`. The longest wins, ties go to the most
//! recent. A match may overlap the pattern (a run of one repeated token
//! predicts more of it). The draft is what followed the match, up to
//! `max_draft` tokens, clipped at the corpus end. Below `min_match` it drafts
//! nothing.

/// The matcher's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramConfig {
    /// Shortest common suffix that may draft (`--ngram-min-match`, default 3).
    pub min_match: usize,
    /// Longest suffix compared (the cap; longer matches score the same).
    pub max_match: usize,
    /// Most tokens drafted (the verify batch width, `--draft`).
    pub max_draft: usize,
}

/// Default `--ngram-min-match`.
pub const DEFAULT_MIN_MATCH: usize = 3;
/// Default cap on the compared suffix length.
pub const DEFAULT_MAX_MATCH: usize = 16;

impl Default for NgramConfig {
    fn default() -> Self {
        Self {
            min_match: DEFAULT_MIN_MATCH,
            max_match: DEFAULT_MAX_MATCH,
            max_draft: 3,
        }
    }
}

/// The match a draft came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramDraft {
    /// Index of the last token of the matched occurrence.
    pub match_end: usize,
    /// Length of the common suffix (capped at `max_match`).
    pub match_len: usize,
    /// The tokens that followed the match (1..=max_draft of them).
    pub tokens: Vec<u32>,
}

/// Length of the common suffix of `corpus[..=end]` and `corpus`, at most `cap`.
fn common_suffix(corpus: &[u32], end: usize, cap: usize) -> usize {
    let last = corpus.len() - 1;
    let limit = cap.min(end + 1);
    (0..limit)
        .take_while(|&i| corpus[end - i] == corpus[last - i])
        .count()
}

/// The draft for the next step, or `None` when no candidate reaches `min_match`
/// (or the corpus is too short to have a candidate).
pub fn draft(corpus: &[u32], cfg: &NgramConfig) -> Option<NgramDraft> {
    if corpus.len() < 2 || cfg.max_draft == 0 || cfg.max_match == 0 {
        return None;
    }
    let mut best: Option<(usize, usize)> = None; // (len, end)
    for end in 0..corpus.len() - 1 {
        let len = common_suffix(corpus, end, cfg.max_match);
        // `>=` so that a later end with an equal length wins (most recent).
        if len > 0 && best.is_none_or(|(b, _)| len >= b) {
            best = Some((len, end));
        }
    }
    let (match_len, match_end) = best?;
    if match_len < cfg.min_match.max(1) {
        return None;
    }
    let from = match_end + 1;
    let to = (from + cfg.max_draft).min(corpus.len());
    Some(NgramDraft {
        match_end,
        match_len,
        tokens: corpus[from..to].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(min_match: usize, max_draft: usize) -> NgramConfig {
        NgramConfig {
            min_match,
            max_match: DEFAULT_MAX_MATCH,
            max_draft,
        }
    }

    #[test]
    fn drafts_what_followed_the_earlier_occurrence() {
        // 1 2 3 4 5 ... 1 2 3 -> the earlier "1 2 3" was followed by 4 5.
        let c = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        let d = draft(&c, &cfg(3, 2)).unwrap();
        assert_eq!(d.match_end, 2);
        assert_eq!(d.match_len, 3);
        assert_eq!(d.tokens, vec![4, 5]);
    }

    #[test]
    fn the_pattern_never_matches_itself() {
        // No earlier occurrence of the suffix: the only full match would be
        // the corpus end itself, which is not a candidate.
        let c = [7, 8, 9, 1, 2, 3];
        assert_eq!(draft(&c, &cfg(1, 3)), None);
    }

    #[test]
    fn longest_match_wins_over_a_more_recent_shorter_one() {
        // "0 1 2 3" occurs at the start (len 4 match with the suffix), "2 3" also
        // recently (len 2). The longer one wins although it is older.
        let c = [0, 1, 2, 3, 40, 41, 5, 2, 3, 50, 0, 1, 2, 3];
        let d = draft(&c, &cfg(2, 2)).unwrap();
        assert_eq!(d.match_len, 4);
        assert_eq!(d.match_end, 3);
        assert_eq!(d.tokens, vec![40, 41]);
    }

    #[test]
    fn ties_go_to_the_most_recent() {
        // "1 2 3" occurs twice before the suffix, followed by 4 then by 6.
        let c = [1, 2, 3, 4, 0, 1, 2, 3, 6, 0, 9, 1, 2, 3];
        let d = draft(&c, &cfg(3, 1)).unwrap();
        assert_eq!(d.match_len, 3);
        assert_eq!(d.match_end, 7);
        assert_eq!(d.tokens, vec![6]);
    }

    #[test]
    fn the_draft_is_clipped_at_the_corpus_end() {
        // The match ends two before the end: at most one token follows it
        // before the pattern, then the pattern's own tokens (overlap), and
        // nothing past the corpus end.
        let c = [5, 6, 5, 6, 5, 6];
        let d = draft(&c, &cfg(2, 8)).unwrap();
        // The most recent candidate with the longest common suffix is end 3
        // (len 4: 5 6 5 6), followed by 5 6 (the corpus end clips the draft).
        assert_eq!(d.match_end, 3);
        assert_eq!(d.match_len, 4);
        assert_eq!(d.tokens, vec![5, 6]);
    }

    #[test]
    fn a_match_may_overlap_the_pattern() {
        // A run of one token: the candidate ending one before the end shares
        // a suffix of 4 with the corpus (overlapping it), and drafts the run on.
        let c = [3, 9, 9, 9, 9, 9];
        let d = draft(&c, &cfg(3, 3)).unwrap();
        assert_eq!(d.match_end, 4);
        assert_eq!(d.match_len, 4);
        assert_eq!(d.tokens, vec![9]);
    }

    #[test]
    fn the_gate_is_inclusive_at_min_match() {
        let c = [1, 2, 3, 4, 8, 2, 3];
        // The common suffix "2 3" has length 2.
        assert_eq!(draft(&c, &cfg(2, 1)).unwrap().tokens, vec![4]);
        assert_eq!(draft(&c, &cfg(3, 1)), None);
    }

    #[test]
    fn the_match_length_is_capped() {
        let c: Vec<u32> = (0..40).chain(0..40).collect();
        let d = draft(
            &c,
            &NgramConfig {
                min_match: 3,
                max_match: 8,
                max_draft: 2,
            },
        )
        .unwrap();
        assert_eq!(d.match_len, 8);
        // The only earlier occurrence of "... 38 39" ends at 39, followed by 0 1.
        assert_eq!(d.match_end, 39);
        assert_eq!(d.tokens, vec![0, 1]);
    }

    #[test]
    fn short_or_empty_corpora_draft_nothing() {
        assert_eq!(draft(&[], &cfg(1, 3)), None);
        assert_eq!(draft(&[4], &cfg(1, 3)), None);
        // Two equal tokens: candidate 0 matches the suffix with length 1.
        assert_eq!(draft(&[4, 4], &cfg(1, 3)).unwrap().tokens, vec![4]);
        assert_eq!(draft(&[1, 2, 1], &cfg(1, 0)), None);
    }
}
