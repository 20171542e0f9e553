//! The fixture zoo: each family's tiny model loads, runs resident, and streams
//! its experts with the same text.

use crate::common::{bmoe, stderr, stdout};

/// The zoo model of `arch` in `quant` (from the fixture cache); a Q4_K_M one
/// has llama-quantize's types.
fn zoo_model(arch: &str, quant: &str) -> String {
    let m = crate::common::zoo_model(arch, quant);
    if quant == "q4_k_m" {
        assert_q4_k_m_types(std::path::Path::new(&m));
    }
    m
}

/// `bmoe run` of 16 greedy tokens on `model` with `flags`, which must succeed: its
/// stdout and stderr. 16 is the fewest at which every family's text changes
/// when its expert computation does (top-1 instead of top-2, or cold experts
/// dropped; qwen35moe's only from the 16th token), and a cache of 25% of the
/// experts evicts dozens of times.
pub(crate) fn run16(model: &str, flags: &[&str]) -> (String, String) {
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

/// One family's proof, on its F32 model and on one more quant type for its
/// experts: the streamed text equals the resident text at `--cache-mb 0`, at a
/// cache that evicts on every token, with `--overlap`, and with `--overlap
/// --predict-prefetch` (or a one-line refusal naming the family where the
/// next layer's routing cannot be guessed); the lossy knobs run to the end
/// and say they are lossy.
fn family_streams_exactly(arch: &str, quant: &str, predicts: bool, mtp: bool) {
    let m = zoo_model(arch, "f32");
    if arch == "qwen35moe" {
        let layout = bmoe::layout::MoeLayout::open(std::path::Path::new(&m)).unwrap();
        assert_eq!(
            layout.fused_layers().len(),
            3,
            "every block's experts fused"
        );
    }
    let run = |flags: &[&str]| run16(&m, flags);
    let (resident, _) = run(&["--resident"]);
    let (streamed, err) = run(&["--cache-mb", "0"]);
    assert_eq!(streamed, resident, "{arch} cache 0");
    assert!(err.contains("moe-cache: budget 0 MiB"), "{err}");
    let (small, err) = run(&["--cache-mb", "25%"]);
    assert_eq!(small, resident, "{arch} cache 25%");
    assert!(
        !err.contains("evictions 0,"),
        "{arch}: nothing evicted: {err}"
    );
    assert_eq!(run(&["--cache-mb", "0", "--overlap"]).0, resident, "{arch}");
    let predict = ["--cache-mb", "0", "--overlap", "--predict-prefetch"];
    if predicts {
        let (text, err) = run(&predict);
        assert_eq!(text, resident, "{arch} predict");
        assert!(err.contains("predictor: "), "{err}");
    } else {
        let o = bmoe(&[&["run", "-m", &m, "-p", "hi", "-n", "2"][..], &predict].concat());
        let err = stderr(&o);
        assert!(!o.status.success() && err.contains(arch), "{arch}: {err}");
        assert!(err.contains("drop --predict-prefetch"), "{err}");
    }
    if mtp {
        let (text, err) = run(&["--cache-mb", "0", "--mtp", "--draft", "2"]);
        assert_eq!(text, resident, "{arch} mtp");
        assert!(err.contains("mtp: draft 2"), "{err}");
    }
    for lossy in [
        &["--drop-cold-experts", "0.5"][..],
        &["--n-expert-used", "1"],
    ] {
        if arch == "deepseek4" && lossy[0] == "--n-expert-used" {
            // Its hash-routed layer's table holds the file's count per token.
            let o = bmoe(&[&["run", "-m", &m, "-p", "hi", "-n", "2"][..], lossy].concat());
            let err = stderr(&o);
            assert!(!o.status.success(), "{arch}: {err}");
            assert!(err.contains("drop --n-expert-used"), "{err}");
            continue;
        }
        let (_, err) = run(&[&["--cache-mb", "0"][..], lossy].concat());
        assert!(err.contains("LOSSY"), "{arch} {lossy:?}: {err}");
    }
    let q = zoo_model(arch, quant);
    let resident = run16(&q, &["--resident"]).0;
    assert_eq!(
        run16(&q, &["--cache-mb", "0", "--overlap"]).0,
        resident,
        "{arch} {quant}"
    );
}

macro_rules! family_tests {
    ($($name:ident: $arch:literal, $quant:literal, $predicts:literal, $mtp:literal;)*) => {$(
        #[test]
        fn $name() {
            family_streams_exactly($arch, $quant, $predicts, $mtp);
        }
    )*};
}

// Every family with one more of the types real files use for their experts
// (quantized by ggml, as llama-quantize would); whether `--predict-prefetch`
// applies and whether the model has an MTP block.
family_tests! {
    qwen3moe_streams_exactly: "qwen3moe", "q8_0", true, false;
    qwen35moe_streams_exactly: "qwen35moe", "q4_1", true, true;
    qwen2moe_streams_exactly: "qwen2moe", "q5_K", true, false;
    olmoe_streams_exactly: "olmoe", "bf16", true, false;
    minimax_m2_streams_exactly: "minimax-m2", "q4_0", true, false;
    granitemoe_streams_exactly: "granitemoe", "f16", true, false;
    gpt_oss_streams_exactly: "gpt-oss", "mxfp4", true, false;
    llama4_streams_exactly: "llama4", "iq4_xs", false, false;
    glm4moe_streams_exactly: "glm4moe", "iq2_xxs", true, true;
    deepseek2_streams_exactly: "deepseek2", "q4_k_m", true, false;
    nemotron_h_moe_streams_exactly: "nemotron_h_moe", "q8_0", true, false;
    deepseek4_streams_exactly: "deepseek4", "q5_0", true, false;
}

#[test]
fn every_zoo_family_has_its_test() {
    // The macro above names each family once; a new family needs a line.
    let tested = [
        "qwen3moe",
        "qwen35moe",
        "qwen2moe",
        "olmoe",
        "minimax-m2",
        "granitemoe",
        "gpt-oss",
        "llama4",
        "glm4moe",
        "deepseek2",
        "nemotron_h_moe",
        "deepseek4",
    ];
    for f in bmoe::fixture::zoo::Family::ALL {
        assert!(tested.contains(&f.arch()), "no test for {}", f.arch());
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
