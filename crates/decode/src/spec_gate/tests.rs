use super::*;

fn cost(verify_s: f64, draft_s: f64) -> StepCost {
    StepCost { verify_s, draft_s }
}

/// A gate that has seen `n` steps of a host where a decode of width w costs
/// `verify(w)` and a source whose every draft is kept with chance `p`, each
/// independently (seeded).
fn trained(p: f64, verify: impl Fn(usize) -> f64, n: usize) -> Gate {
    let mut g = Gate::new(4);
    let mut rng = bmoe_flash::xorshift::XorShift::new(0x0dd5_eed5);
    g.observe(Source::Ngram, &[], 0, cost(verify(1), 0.0));
    for _ in 0..n {
        let c = g.choose(Source::Ngram, &[0; 4]);
        let mut keep = |_| (rng.next_u64() % 1000) as f64 / 1000.0 < p;
        let kept = (0..c.k).take_while(|&i| keep(i)).count();
        g.observe(
            Source::Ngram,
            &vec![0; c.k],
            kept,
            cost(verify(c.k + 1), 0.0),
        );
    }
    g
}

#[test]
fn the_first_step_is_a_plain_decode_to_learn_what_one_costs() {
    let g = Gate::new(3);
    let c = g.choose(Source::Ngram, &[0, 0, 0]);
    assert_eq!((c.k, c.held_back), (0, Some(HeldBack::NotWorthIt)));
    assert_eq!(
        g.choose(Source::Ngram, &[]).held_back,
        Some(HeldBack::NoDraft)
    );
}

#[test]
fn expected_kept_tokens_follow_the_chain_of_acceptances() {
    let mut g = Gate::new(3);
    g.observe(Source::Ngram, &[], 0, cost(0.1, 0.0));
    // Widths cost the same: every extra kept token is free, so draft all.
    for w in 2..=4 {
        g.observe(Source::Ngram, &vec![3; w - 1], w - 1, cost(0.1, 0.0));
    }
    let c = g.choose(Source::Ngram, &[3, 3, 3]);
    assert_eq!(c.k, 3);
    let p = |i| g.p_keep(Source::Ngram, i, 3);
    let want = 1.0 + p(0) + p(0) * p(1) + p(0) * p(1) * p(2);
    assert!((c.expected_kept - want).abs() < 1e-12, "{c:?}");
    assert!((c.predicted_s - 0.1).abs() < 1e-12);
}

#[test]
fn a_rejection_counts_as_seen_and_the_positions_after_it_are_not() {
    let mut g = Gate::new(3);
    g.observe(Source::Mtp, &[1, 1, 1], 1, cost(0.1, 0.03));
    let p = |i| g.p_keep(Source::Mtp, i, 1);
    assert!(p(0) > 0.5, "position 0 was kept");
    assert!(p(1) < p(0), "position 1 was rejected");
    // Position 2 was never judged: its estimate is position 1's over all
    // buckets (the prior position 1's bucket was drawn toward too).
    assert!(p(1) < p(2) && p(2) < p(0), "{} {} {}", p(0), p(1), p(2));
    // Bucket 2 has no counts: it takes its position's estimate over all buckets.
    let other = g.p_keep(Source::Mtp, 0, 2);
    assert!(0.5 < other && other < p(0), "{other}");
    assert_eq!(
        g.p_keep(Source::Ngram, 0, 1),
        0.5,
        "sources keep their own counts"
    );
}

#[test]
fn drafting_stops_where_a_wider_batch_costs_more_than_it_keeps() {
    // Streaming: each extra row reads its own experts, +60% per row, and half
    // the drafts are kept: a draft of one or more loses.
    let g = trained(0.5, |w| 0.1 * (1.0 + 0.6 * (w - 1) as f64), 200);
    assert_eq!(g.choose(Source::Ngram, &[0; 4]).k, 0);
    // Resident-like: rows are nearly free, so draft far.
    let g = trained(0.5, |w| 0.1 * (1.0 + 0.02 * (w - 1) as f64), 200);
    assert!(g.choose(Source::Ngram, &[0; 4]).k >= 2);
}

#[test]
fn drafting_cost_holds_back_an_expensive_source() {
    let mut g = Gate::new(2);
    g.observe(Source::Mtp, &[], 0, cost(0.1, 0.0));
    g.observe(Source::Mtp, &[0], 1, cost(0.105, 0.0));
    assert_eq!(
        g.choose(Source::Mtp, &[0]).k,
        1,
        "cheap draft, fair chance: draft"
    );
    // The head's pass costs as much as a decode: at p < 1 it cannot pay.
    g.observe(Source::Mtp, &[0], 1, cost(0.105, 0.1));
    g.observe(Source::Mtp, &[0], 1, cost(0.105, 0.1));
    g.observe(Source::Mtp, &[0], 0, cost(0.105, 0.1));
    for _ in 0..20 {
        g.observe(Source::Mtp, &[0], 0, cost(0.105, 0.1));
    }
    let c = g.choose(Source::Mtp, &[0]);
    assert_eq!((c.k, c.held_back), (0, Some(HeldBack::NotWorthIt)), "{c:?}");
}

/// Property: over random hosts and acceptances, the rate the gate reaches
/// (tokens kept over seconds spent, its exploring steps included, after a
/// warm-up of 100 steps) is at least 0.97x the plain decode's and 0.9x the
/// best fixed draft length's.
#[test]
fn the_gate_never_loses_much_against_plain_or_the_best_fixed_k() {
    // The hosts are drawn from their own stream, so that they do not change
    // with the gate's choices (which draw the acceptances from another).
    let mut hosts = bmoe_flash::xorshift::XorShift::new(0x5eed_9a7e);
    let mut rng = bmoe_flash::xorshift::XorShift::new(0xacce_97ed);
    let mut next = move || rng.next_u64();
    for _ in 0..40 {
        let p = (hosts.next_u64() % 11) as f64 / 10.0;
        let slope = (hosts.next_u64() % 100) as f64 / 100.0;
        let verify = |w: usize| 0.1 * (1.0 + slope * (w - 1) as f64);
        // Expected rate of a fixed k (tokens per second).
        let fixed = |k: usize| {
            let kept: f64 = (0..=k).map(|i| p.powi(i as i32)).sum();
            kept / verify(k + 1)
        };
        let best_fixed = (0..=4).map(fixed).fold(0.0, f64::max);
        let mut g = Gate::new(4);
        g.observe(Source::Ngram, &[], 0, cost(verify(1), 0.0));
        let (mut tokens, mut seconds) = (0.0, 0.0);
        for step in 0..2000 {
            let c = g.choose(Source::Ngram, &[0; 4]);
            let kept = (0..c.k)
                .take_while(|_| (next() % 1000) as f64 / 1000.0 < p)
                .count();
            g.observe(
                Source::Ngram,
                &vec![0; c.k],
                kept,
                cost(verify(c.k + 1), 0.0),
            );
            if step >= 100 {
                tokens += 1.0 + kept as f64;
                seconds += verify(c.k + 1);
            }
        }
        let rate = tokens / seconds;
        assert!(
            rate >= 0.9 * best_fixed && rate >= 0.99 * fixed(0),
            "p {p} slope {slope}: reached {rate:.2} tok/s, best fixed {best_fixed:.2}, plain {:.2}",
            fixed(0)
        );
    }
}

#[test]
fn buckets_split_the_evidence() {
    assert_eq!(bucket(Source::Ngram, 3.0), 0);
    assert_eq!(bucket(Source::Ngram, 6.0), 2);
    assert_eq!(bucket(Source::Ngram, 16.0), 3);
    assert_eq!(bucket(Source::Mtp, 0.2), 0);
    assert_eq!(bucket(Source::Mtp, 0.97), 3);
}

#[test]
fn a_source_held_back_is_tried_again_now_and_then() {
    let mut g = Gate::new(2);
    g.observe(Source::Ngram, &[], 0, cost(0.1, 0.0));
    for _ in 0..30 {
        g.observe(Source::Ngram, &[0], 0, cost(0.2, 0.0));
    }
    let explored = explorations(&mut g, 900, 0.2, false);
    // Plain steps before each exploration: 32, doubled after each one that
    // did not pay, up to 256.
    let waits: Vec<usize> = explored.windows(2).map(|w| w[1] - w[0] - 1).collect();
    assert_eq!(explored[0], EXPLORE_EVERY as usize, "{explored:?}");
    assert_eq!(waits, [64, 128, 256, 256], "{explored:?}");
    assert_eq!(g.explore_every(), EXPLORE_EVERY_MAX);
}

/// Drive `g` for `steps` steps of a host where a 2-row decode costs
/// `wide_s` (a plain one 0.1 s) and the draft is kept when `kept`; the steps
/// at which it explored.
fn explorations(g: &mut Gate, steps: usize, wide_s: f64, kept: bool) -> Vec<usize> {
    let mut explored = Vec::new();
    for step in 0..steps {
        let c = g.choose(Source::Ngram, &[0]);
        if c.explore {
            explored.push(step);
        }
        let kept = usize::from(kept && c.k > 0);
        let verify_s = if c.k > 0 { wide_s } else { 0.1 };
        g.observe(Source::Ngram, &vec![0; c.k], kept, cost(verify_s, 0.0));
    }
    explored
}

#[test]
fn a_draft_the_gate_chooses_again_resets_the_wait_before_exploring() {
    // Backed off on a host where a wide decode is dear and drafts fail...
    let mut g = Gate::new(1);
    g.observe(Source::Ngram, &[], 0, cost(0.1, 0.0));
    for _ in 0..5 {
        g.observe(Source::Ngram, &[0], 0, cost(0.2, 0.0));
    }
    explorations(&mut g, 300, 0.2, false);
    assert!(
        g.explore_every() > 2 * EXPLORE_EVERY,
        "{}",
        g.explore_every()
    );
    // ...then a wide decode turns cheap and every draft is kept: after the
    // next exploration the gate drafts by itself, and the wait is back to 32.
    let explored = explorations(&mut g, 600, 0.105, true);
    assert!(!explored.is_empty());
    assert_eq!(g.explore_every(), EXPLORE_EVERY);
    assert_eq!(g.choose(Source::Ngram, &[0]).k, 1, "drafting pays again");
}

#[test]
fn one_slow_first_decode_at_a_width_does_not_hold_it_back() {
    // Resident-like: width 2 costs 5% more than plain, but its first decode
    // took 4x (llama.cpp building the graph for a new batch size).
    let mut g = Gate::new(1);
    g.observe(Source::Ngram, &[], 0, cost(0.1, 0.0));
    g.observe(Source::Ngram, &[0], 1, cost(0.4, 0.0));
    let mut drafted = 0;
    for _ in 0..40 {
        let c = g.choose(Source::Ngram, &[0]);
        drafted += c.k;
        let w = if c.k == 1 { 0.105 } else { 0.1 };
        g.observe(Source::Ngram, &vec![0; c.k], c.k, cost(w, 0.0));
    }
    assert!(drafted >= 35, "drafted on {drafted} of 40 steps");
    assert!((g.verify_cost_s(2).unwrap() - 0.105).abs() < 1e-9);
}

#[test]
fn one_slow_first_plain_decode_does_not_make_drafting_look_free() {
    // The first plain decode took 15x (a loaded host, a graph being built);
    // every later decode, plain or 2 rows, takes 0.02 s, drafting a token
    // 0.04 s, and no draft is kept: drafting never pays.
    let mut g = Gate::new(1);
    g.observe(Source::Mtp, &[], 0, cost(0.3, 0.0));
    let mut drafted = 0;
    for _ in 0..40 {
        let c = g.choose(Source::Mtp, &[0]);
        drafted += c.k;
        let draft_s = 0.04 * c.k as f64;
        g.observe(Source::Mtp, &vec![0; c.k], 0, cost(0.02, draft_s));
    }
    assert!(drafted <= 3, "drafted on {drafted} of 40 steps");
    assert!((g.verify_cost_s(1).unwrap() - 0.02).abs() < 1e-9);
}

#[test]
fn a_width_measured_on_a_cold_cache_follows_the_plain_decode_as_it_warms() {
    // Streaming: every decode gets 4x cheaper as the cache warms; width 2
    // stays at 1.2x plain throughout. Measured cold, then only plain decodes.
    let mut g = Gate::new(1);
    for _ in 0..3 {
        g.observe(Source::Ngram, &[], 0, cost(0.4, 0.0));
        g.observe(Source::Ngram, &[0], 1, cost(0.48, 0.0));
    }
    for _ in 0..9 {
        g.observe(Source::Ngram, &[], 0, cost(0.1, 0.0));
    }
    assert!((g.verify_cost_s(2).unwrap() - 0.12).abs() < 1e-9);
}

#[test]
fn one_slow_first_draft_does_not_price_the_source_out() {
    // The head's first pass took 10x (its graph being built); later ones
    // cost 3% of a decode per token and drafts are kept 9 times in 10.
    let mut g = Gate::new(1);
    g.observe(Source::Mtp, &[], 0, cost(0.1, 0.0));
    g.observe(Source::Mtp, &[0], 1, cost(0.15, 0.03));
    for kept in [1, 1, 0, 1] {
        g.observe(Source::Mtp, &[0], kept, cost(0.15, 0.003));
    }
    assert!((g.draft_s_per_token(Source::Mtp).unwrap() - 0.003).abs() < 1e-12);
    assert_eq!(g.choose(Source::Mtp, &[0]).k, 1, "worth drafting");
}

#[test]
fn drafts_held_back_still_teach_the_gate_when_they_cost_nothing() {
    // A 2-row decode costs 1.5x a plain one: at the prior's 0.5 a draft does
    // not pay, so the gate holds the matcher back; the tokens the target
    // then produced show its drafts would have been kept.
    let mut g = Gate::new(1);
    g.observe(Source::Ngram, &[], 0, cost(0.1, 0.0));
    g.observe(Source::Ngram, &[0], 0, cost(0.15, 0.0));
    assert_eq!(g.choose(Source::Ngram, &[0]).k, 0, "not worth it yet");
    for _ in 0..20 {
        g.observe_unverified(Source::Ngram, 0, 0, true);
    }
    assert!(g.p_keep(Source::Ngram, 0, 0) > 0.9);
    assert_eq!(g.choose(Source::Ngram, &[0]).k, 1, "worth it now");
}
