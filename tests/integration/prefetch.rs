//! Read-ahead and the lossy knobs on E8K2: prefetch never changes a token,
//! the drop and the top-k override say what they cut and mark the run lossy.

use bmoe::engine::Mode;
use bmoe::lab::compare::RunCsv;
use bmoe::stream::{CacheSize, StreamConfig};

use crate::common::{bmoe, e8k2, e8k2_cli, e8k2_run as run, stderr, stdout, summary_number, PROSE};

fn stream(cache_mb: u64, overlap: bool, prefetch: u32, predict: bool) -> Mode {
    Mode::Stream(StreamConfig {
        cache: CacheSize::Mib(cache_mb),
        overlap,
        prefetch,
        predict_prefetch: predict,
        ..StreamConfig::default()
    })
}

#[test]
fn prefetch_and_prediction_keep_every_token() {
    // 16 tokens: each read-ahead is judged used or wasted at the next layer's
    // demand, and 16 tokens of 29 guessed layers make ~900 router guesses, far
    // more than it takes to tell the guess (about 70% right) from chance (25%).
    let n = 16;
    let resident = run(Mode::Resident, n);
    for (name, mode) in [
        ("cache 0, --prefetch 1", stream(0, false, 1, false)),
        (
            "cache 64, overlap, --prefetch 2",
            stream(64, true, 2, false),
        ),
        ("cache 0, --predict-prefetch", stream(0, false, 0, true)),
        (
            "cache 64, overlap, --prefetch 1 --predict-prefetch",
            stream(64, true, 1, true),
        ),
    ] {
        let r = run(mode, n);
        assert_eq!(
            r.generation.tokens, resident.generation.tokens,
            "{name}: token ids differ from --resident"
        );
        let p = &r.prefetch;
        assert!(p.read_bytes > 0, "{name}: nothing was read ahead");
        assert!(
            p.useful_bytes + p.wasted_bytes <= p.read_bytes,
            "{name}: judged more than was read ({p:?})"
        );
        assert!(
            p.useful_bytes > 0,
            "{name}: no prefetched slice was used ({p:?})"
        );
        let row_prefetch: u64 = r.rows.iter().map(|x| x.reads.prefetch_bytes).sum();
        assert!(row_prefetch <= p.read_bytes && row_prefetch > 0, "{name}");
        // Every byte read is in the flash total; rows hold all but the read-ahead
        // still in flight after the last decode.
        let rows: u64 = r.rows.iter().map(|x| x.reads.read_bytes).sum();
        assert!(rows <= r.flash.read_bytes, "{name}");
        assert!(
            rows + (p.read_bytes - row_prefetch) >= r.flash.read_bytes,
            "{name}"
        );
        if name.contains("predict") {
            let (guessed, used) = p.predicted.total();
            assert!(guessed > 0, "{name}: no guesses");
            assert!(used <= guessed);
            // Layer 0 is never guessed (no layer before it); every later one is.
            assert_eq!(p.predicted.by_layer.first().map_or(0, |l| l.0), 0);
            assert!(
                p.predicted.by_layer.iter().skip(1).all(|l| l.0 > 0),
                "{p:?}"
            );
            assert!(
                used * 4 > guessed,
                "{name}: the router guess is no better than chance (1 in 4 for top-2 of 8): {p:?}"
            );
        }
    }
}

fn csv_run(dir: &std::path::Path, name: &str, extra: &[&str]) -> (RunCsv, String, String) {
    let csv = dir.join(format!("{name}.csv"));
    let csv_s = csv.to_str().unwrap();
    let mut args = vec!["--csv", csv_s];
    args.extend_from_slice(extra);
    let o = e8k2_cli(PROSE, 24, &args);
    let err = stderr(&o);
    assert!(o.status.success(), "{name}: {err}");
    (RunCsv::open(&csv).expect("parse CSV"), err, stdout(&o))
}

fn per_token(r: &RunCsv, col: &str) -> f64 {
    let v = r.decode_series(col);
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn lossy_knobs_report_what_they_cut_and_are_marked() {
    let dir = tempfile::tempdir().unwrap();
    let (base, base_err, base_text) = csv_run(dir.path(), "base", &["--cache-mb", "0"]);
    assert_eq!(base.preamble["lossy"], "0");
    assert!(!base_err.contains("moe-drop:"), "{base_err}");

    // The knob at 0 is the plain path: same text, not lossy.
    let (zero, _, zero_text) = csv_run(
        dir.path(),
        "zero",
        &["--cache-mb", "0", "--drop-cold-experts", "0"],
    );
    assert_eq!(zero.preamble["lossy"], "0");
    assert_eq!(zero.preamble["drop_cold_frac"], "0");
    assert_eq!(zero_text, base_text, "the knob at 0 changes nothing");
    assert_eq!(zero.trailer["dropped_experts"], "0");

    let (drop, drop_err, _) = csv_run(
        dir.path(),
        "drop",
        &["--cache-mb", "0", "--drop-cold-experts", "0.75"],
    );
    assert_eq!(drop.preamble["lossy"], "1");
    assert_eq!(drop.preamble["drop_cold_frac"], "0.75");
    let dropped: f64 = drop.decode_series("dropped_experts").iter().sum();
    assert!(
        dropped > 0.0,
        "nothing dropped at 0.75 with cache 0:\n{drop_err}"
    );
    assert!(drop_err.contains("moe-drop: LOSSY"), "{drop_err}");
    assert_eq!(
        summary_number(&drop_err, "moe-drop:", "dropped "),
        drop.trailer["dropped_experts"].parse::<f64>().unwrap()
    );
    // Every dropped expert is a read not made: exactly one slot per drop.
    let slot = per_token(&base, "read_bytes") / 60.0; // 30 layers x top-2
    let cut = per_token(&base, "read_bytes") - per_token(&drop, "read_bytes");
    let dropped_per_token = dropped / drop.decode_series("dropped_experts").len() as f64;
    assert!(
        (cut - dropped_per_token * slot).abs() < 1.0,
        "bytes cut {cut} != dropped {dropped_per_token}/token x slot {slot}"
    );

    let (top1, top1_err, _) = csv_run(
        dir.path(),
        "top1",
        &["--cache-mb", "0", "--n-expert-used", "1"],
    );
    assert_eq!(top1.preamble["lossy"], "1");
    assert_eq!(top1.preamble["n_expert_used"], "1");
    assert_eq!(top1.preamble["n_expert_used_model"], "2");
    assert!(top1_err.contains("top-k 1 of the model's 2"), "{top1_err}");
    let half = per_token(&base, "read_bytes") / 2.0;
    assert!(
        (per_token(&top1, "read_bytes") - half).abs() < 1.0,
        "top-1 reads half of top-2's bytes per token"
    );
}

#[test]
fn lossy_knobs_refuse_out_of_range_values() {
    let m = e8k2();
    for (args, needle) in [
        (vec!["--n-expert-used", "9"], "choose 1..=8"),
        (vec!["--drop-cold-experts", "1.5"], "fraction in 0..=1"),
        (vec!["--resident", "--prefetch", "1"], "cannot be used with"),
    ] {
        let mut a = vec!["run", "-m", m.to_str().unwrap(), "-p", "hi", "-n", "2"];
        a.extend_from_slice(&args);
        let o = bmoe(&a);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
