//! `bmoe run`'s sampling flags on E8K2: a seeded draw repeats and differs from
//! the greedy text, --stop cuts the text before the stop string, and a draw
//! with speculation or a setting out of range is refused with exit 2.

use super::common::{e8k2_cli, stderr, stdout, PROSE};

#[test]
fn seeded_draws_repeat_and_stop_strings_cut_the_text() {
    let greedy = stdout(&e8k2_cli(PROSE, 24, &["--ignore-eos"]));
    let draw = |seed: &str| {
        stdout(&e8k2_cli(
            PROSE,
            24,
            &["--ignore-eos", "--temp", "1.5", "--seed", seed],
        ))
    };
    let (a, b) = (draw("11"), draw("11"));
    assert_eq!(a, b, "the same seed draws the same text");
    assert_ne!(
        a, greedy,
        "a draw at temperature 1.5 leaves the argmax somewhere in 24 tokens"
    );
    let word = greedy
        .split_whitespace()
        .nth(3)
        .expect("four words")
        .to_string();
    let out = e8k2_cli(PROSE, 24, &["--ignore-eos", "--stop", &word]);
    assert_eq!(
        stdout(&out).trim_end_matches('\n'),
        &greedy[..greedy.find(&word).unwrap()]
    );
    assert!(stderr(&out).contains("(stop string)"), "{}", stderr(&out));
}

#[test]
fn a_draw_with_speculation_or_out_of_range_is_refused() {
    let spec = e8k2_cli(PROSE, 4, &["--temp", "0.7", "--ngram"]);
    assert_eq!(spec.status.code(), Some(2));
    assert!(
        stderr(&spec).contains("speculation keeps only tokens equal"),
        "{}",
        stderr(&spec)
    );
    let bad = e8k2_cli(PROSE, 4, &["--temp", "0.7", "--top-p", "1.5"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("--top-p"), "{}", stderr(&bad));
}
