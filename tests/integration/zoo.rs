//! The fixture zoo: each family's tiny model loads, runs resident, and streams
//! its experts with the same text.

use crate::common::{bmoe, fixture_dir, stderr, stdout};

/// `bmoe run` of 16 tokens on `model` with `flags`, which must succeed: its
/// stdout and stderr.
fn run16(model: &str, flags: &[&str]) -> (String, String) {
    let mut args = vec![
        "run",
        "-m",
        model,
        "-p",
        "Hello world",
        "-n",
        "16",
        "--ignore-eos",
    ];
    args.extend_from_slice(flags);
    let o = bmoe(&args);
    assert!(o.status.success(), "{model} {flags:?}: {}", stderr(&o));
    (stdout(&o), stderr(&o))
}

#[test]
fn each_zoo_family_streams_with_the_resident_text() {
    let mut cases: Vec<(&str, &str)> = bmoe::fixture::zoo::Family::ALL
        .iter()
        .map(|f| (f.arch(), "f32"))
        .collect();
    // The quant types real files use for their experts, quantized by ggml.
    cases.extend([
        ("deepseek2", "q4_k_m"),
        ("qwen2moe", "q5_K"),
        ("qwen3moe", "q8_0"),
        ("minimax-m2", "q4_0"),
        ("gpt-oss", "mxfp4"),
        ("llama4", "iq4_xs"),
        ("glm4moe", "iq2_xxs"),
        ("olmoe", "bf16"),
        ("granitemoe", "f16"),
    ]);
    for (arch, quant) in cases {
        let dir = tempfile::tempdir_in(fixture_dir()).unwrap();
        let model = dir.path().join(format!("{arch}-{quant}.gguf"));
        let m = model.to_str().unwrap();
        let o = bmoe(&[
            "fixture", "zoo", "--family", arch, "--quant", quant, "-o", m,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        if quant == "q4_k_m" {
            assert_q4_k_m_types(&model);
        }
        let run = |flags: &[&str]| run16(m, flags);
        let (resident, _) = run(&["--resident"]);
        let (streamed, err) = run(&["--cache-mb", "0"]);
        assert_eq!(streamed, resident, "{arch} {quant}");
        assert!(err.contains("moe-cache: budget 0 MiB"), "{err}");
    }
}

/// Q4_K_M as llama-quantize makes it: gate/up experts in q4_K, down in q6_K.
fn assert_q4_k_m_types(model: &std::path::Path) {
    let layout = bmoe::layout::MoeLayout::open(model).unwrap();
    assert!(!layout.experts.is_empty());
    for e in &layout.experts {
        let want = if e.name.contains("ffn_down_exps") {
            "q6_K"
        } else {
            "q4_K"
        };
        assert_eq!(e.ggml_type.name(), want, "{}", e.name);
    }
}

#[test]
fn a_zoo_quant_ggml_does_not_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let o = bmoe(&[
        "fixture",
        "zoo",
        "--family",
        "qwen3moe",
        "--quant",
        "q8_K",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("ggml does not write q8_K"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());
    let o = bmoe(&[
        "fixture",
        "zoo",
        "--family",
        "nope",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the zoo has qwen3moe"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn fused_gate_up_experts_are_streamed_with_the_resident_text() {
    let dir = tempfile::tempdir_in(fixture_dir()).unwrap();
    let model = dir.path().join("fused.gguf");
    let m = model.to_str().unwrap();
    let o = bmoe(&[
        "fixture",
        "tiny-mtp",
        "--fused-gate-up",
        "--trunk-mix",
        "0.25",
        "-o",
        m,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let layout = bmoe::layout::MoeLayout::open(&model).unwrap();
    let fused = layout
        .experts
        .iter()
        .filter(|e| e.name.ends_with("ffn_gate_up_exps.weight"))
        .count();
    assert_eq!(fused, 3, "every block's fused experts are streamable");
    let run = |flags: &[&str]| run16(m, flags).0;
    let resident = run(&["--resident"]);
    for flags in [
        &["--cache-mb", "0"][..],
        &["--cache-mb", "0", "--overlap"],
        &["--cache-mb", "0", "--mtp", "--draft", "2"],
    ] {
        assert_eq!(run(flags), resident, "{flags:?}");
    }
}
