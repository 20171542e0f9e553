//! Real shapes (`bmoe fixture zoo --shape`): each at reduced depth has the
//! real model's widths and types, and streams the same text as `--resident`;
//! a file the disk cannot hold is refused before a byte is written.

use std::process::Command;

use crate::common::{bmoe, build_once, smollm2, stderr, stdout};

/// `shape` cut to `layers` blocks, built once into the fixture directory.
fn shape_model(shape: &str, layers: u32) -> String {
    let name = format!("shape-{shape}-L{layers}.gguf");
    let path = build_once(&name, |out| {
        let (m, l) = (out.to_str().unwrap(), layers.to_string());
        let o = bmoe(&["fixture", "zoo", "--shape", shape, "--layers", &l, "-o", m]);
        assert!(o.status.success(), "{}", stderr(&o));
    });
    path.to_str().unwrap().to_string()
}

/// 16 greedy tokens of `model` with `flags` on two threads (the zoo's run).
fn run16(model: &str, flags: &[&str]) -> (String, String) {
    crate::zoo::run16(model, &[&["-t", "2"][..], flags].concat())
}

/// The shape's `inspect` names its widths (`lines`), and its text streamed
/// at cache 0 and from a 25% cache with overlap equals the resident text.
fn shape_streams_exactly(shape: &str, layers: u32, lines: &[&str]) {
    let m = shape_model(shape, layers);
    let inspect = bmoe(&["inspect", &m]);
    let shown = stdout(&inspect);
    for l in lines {
        assert!(shown.contains(l), "{shape}: no {l:?} in {shown}");
    }
    let (resident, _) = run16(&m, &["--resident"]);
    assert!(!resident.is_empty(), "{shape}: no text");
    let (streamed, err) = run16(&m, &["--cache-mb", "0"]);
    assert_eq!(streamed, resident, "{shape} cache 0");
    assert!(
        err.contains("hit 0.0%") || err.contains("moe-cache: budget 0 MiB"),
        "{err}"
    );
    let (cached, _) = run16(&m, &["--cache-mb", "25%", "--overlap"]);
    assert_eq!(cached, resident, "{shape} cache 25% with overlap");
}

#[test]
fn qwen3_30b_a3b_at_two_blocks_has_its_widths_and_streams_the_resident_text() {
    // 768 rows of 2048 in q4_K: 768 x 1152 bytes per gate slice.
    let lines = [
        "n_expert:         128",
        "n_expert_used:    8",
        "884736 bytes (q4_K)",
    ];
    shape_streams_exactly("qwen3-30b-a3b", 2, &lines);
}

#[test]
fn gpt_oss_20b_at_two_blocks_has_its_widths_and_streams_the_resident_text() {
    // 2880 rows of 2880 in MXFP4: 2880 x 1530 bytes per slice.
    let lines = [
        "n_expert:         32",
        "n_expert_used:    4",
        "4406400 bytes (mxfp4)",
    ];
    shape_streams_exactly("gpt-oss-20b", 2, &lines);
}

#[test]
fn deepseek_v2_lite_at_two_blocks_has_its_widths_and_streams_the_resident_text() {
    // Layer 0 dense, layer 1 with 64 experts of 1408: gate 1408 x 1152 bytes.
    let lines = [
        "n_expert:         64",
        "n_expert_used:    6",
        "1622016 bytes (q4_K)",
    ];
    shape_streams_exactly("deepseek-v2-lite", 2, &lines);
}

#[test]
fn a_shape_the_disk_cannot_hold_is_refused_before_writing_with_both_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q8.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["fixture", "zoo", "--shape", "qwen3-30b-a3b-q8_0", "-o"])
        .arg(&out)
        .env("BMOE_CACHE_DIR", smollm2().parent().unwrap())
        .env("BMOE_FAKE_FREE_BYTES", (1u64 << 30).to_string())
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("has 1024 MiB free but the file needs"),
        "{err}"
    );
    assert!(!out.exists(), "nothing is written");
    let need: u64 = err
        .split("the file needs ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the size needed");
    assert!(
        (29_000..33_000).contains(&need),
        "Q8_0 Qwen3-30B-A3B is about 31 GiB: {need} MiB"
    );
}

#[test]
fn shape_flags_out_of_range_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let o = out.to_str().unwrap();
    for (args, says) in [
        (
            vec!["--shape", "deepseek-v2-lite", "--layers", "1"],
            "give 2..=27",
        ),
        (
            vec!["--shape", "qwen3-30b-a3b", "--layers", "49"],
            "give 1..=48",
        ),
        (vec!["--shape", "llama-7b"], "gpt-oss-20b"),
        (vec!["--family", "qwen3moe", "--layers", "2"], "--layers"),
        (vec!["--shape", "gpt-oss-20b", "--quant", "q8_0"], "--quant"),
    ] {
        let run = bmoe(&[&["fixture", "zoo", "-o", o][..], &args].concat());
        let err = stderr(&run);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!out.exists());
    }
}
