use super::*;

fn shape() -> ModelShape {
    ModelShape {
        n_expert: 4,
        k: 1,
        slot_bytes: vec![100, 0, 200],
        identity: 0xfeed,
    }
}

/// Layer 0 routes expert 2 three times in four and expert 0 once; layer 2
/// routes uniformly (every expert once in four tokens).
fn four_tokens() -> Vec<u32> {
    vec![1, 0, 3, 0, 0, 0, 0, 0, 1, 1, 1, 1]
}

#[test]
fn a_profile_survives_its_own_bytes() {
    let mut p = WarmProfile::empty(shape());
    p.merge_run(&four_tokens());
    let back = WarmProfile::from_bytes(&p.to_bytes()).unwrap();
    assert_eq!(back, p);
    assert_eq!(WarmProfile::for_model(&p.to_bytes(), &shape()).unwrap(), p);
}

#[test]
fn damaged_files_are_refused_never_misread() {
    let mut p = WarmProfile::empty(shape());
    p.merge_run(&four_tokens());
    let bytes = p.to_bytes();
    for cut in 0..bytes.len() {
        assert!(WarmProfile::from_bytes(&bytes[..cut]).is_err(), "cut {cut}");
    }
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x10;
        assert!(WarmProfile::from_bytes(&b).is_err(), "byte {i} flipped");
    }
    let mut b = bytes.clone();
    b[0] = b'X';
    assert_eq!(WarmProfile::from_bytes(&b), Err(WarmError::BadMagic));
    let mut b = bytes;
    b[4] = 9;
    assert_eq!(WarmProfile::from_bytes(&b), Err(WarmError::Version(9)));
}

#[test]
fn another_model_is_named_as_such() {
    let p = WarmProfile::empty(shape());
    let mut other = shape();
    other.identity = 1;
    let e = WarmProfile::for_model(&p.to_bytes(), &other).unwrap_err();
    assert!(
        matches!(e, WarmError::Mismatch(ref why) if why.contains("identity")),
        "{e}"
    );
    let mut wider = shape();
    wider.n_expert = 8;
    let e = WarmProfile::for_model(&p.to_bytes(), &wider).unwrap_err();
    assert!(
        matches!(e, WarmError::Mismatch(ref why) if why.contains("x 8")),
        "{e}"
    );
}

#[test]
fn runs_merge_with_decay() {
    let mut p = WarmProfile::empty(shape());
    p.merge_run(&four_tokens());
    assert_eq!((p.tokens, p.runs), (4.0, 1));
    assert!(!p.is_mature());
    p.merge_run(&four_tokens());
    assert_eq!(p.runs, 2);
    assert!((p.tokens - 7.2).abs() < 1e-9, "{}", p.tokens);
    assert!((p.counts[2] - 5.4).abs() < 1e-6, "{}", p.counts[2]);
}

#[test]
fn the_plan_takes_hot_slots_of_skewed_layers_hottest_first_within_half_the_budget() {
    let mut s = shape();
    s.slot_bytes = vec![100, 0, 100];
    let mut p = WarmProfile::empty(s);
    // Layer 2 skewed too, less than layer 0: expert 1 two tokens in four.
    p.merge_run(&[1, 0, 3, 0, 0, 0, 0, 0, 1, 2, 1, 0]);
    // Budget 400: half is two slots, layer 0's expert 2 (3/4) then layer 2's expert 1 (2/4).
    let keys = p.plan(400);
    let k = |layer, expert| SlotKey { layer, expert };
    assert_eq!(keys, vec![k(0, 2), k(2, 1)]);
    assert_eq!(p.plan(200), vec![k(0, 2)]);
    assert!(p.plan(0).is_empty());
    // A uniform layer and below-uniform slots are never planned.
    let mut u = WarmProfile::empty(shape());
    u.merge_run(&four_tokens());
    assert_eq!(u.plan(10_000), vec![k(0, 2)]);
}

#[test]
fn tokens_are_routings_over_k_per_moe_layer() {
    let s = ModelShape { k: 2, ..shape() };
    // Two MoE layers, k 2: 4 routings per token.
    assert_eq!(run_tokens(&s, &[2, 2, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]), 2.0);
}
