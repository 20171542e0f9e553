//! Tests of `config` (beside it to keep that file on its one topic).
use super::*;
use crate::stream::StreamConfig;

fn layout() -> MoeLayout {
    MoeLayout {
        arch: "llama".into(),
        n_layer: 30,
        n_expert: 64,
        n_expert_used: 4,
        alignment: 4096,
        blocks_in_table: 30,
        ..MoeLayout::default()
    }
}

fn config(mode: Mode) -> RunConfig {
    let base = RunConfig::new(PathBuf::from("m.gguf"), "hi".into());
    RunConfig {
        job: super::JobConfig {
            n_predict: 16,
            ignore_eos: true,
            ..base.job.clone()
        },
        threads: 2,
        n_ctx: 512,
        mode: mode.into(),
        telemetry: TelemetryConfig::default(),
        speculation: SpecConfig {
            source: Speculation::Ngram { min_match: 3 },
            draft_max: 4,
            gated: false,
        },
        ..base
    }
}

fn value<'a>(pairs: &'a [(String, String)], key: &str) -> &'a str {
    let found = pairs.iter().find(|(k, _)| k == key);
    found
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key}"))
}

#[test]
fn an_unknown_expert_layout_is_refused_naming_what_it_saw() {
    let l = MoeLayout {
        unknown_experts: vec!["blk.0.ffn_up_chexps.weight".into()],
        ..layout()
    };
    let cfg = config(Mode::Stream(StreamConfig::default()));
    let err = cfg.check_against(&l).unwrap_err().to_string();
    assert!(err.contains("blk.0.ffn_up_chexps.weight"), "{err}");
    assert!(err.contains("--resident"), "{err}");
    assert!(config(Mode::Resident).check_against(&l).is_ok());
}

#[test]
fn a_streamed_runs_preamble_says_its_reader_and_settings() {
    let sc = StreamConfig {
        overlap: true,
        prefetch: 2,
        ..StreamConfig::default()
    };
    let reader = ReaderFacts {
        budget_bytes: 759 << 20,
        o_direct: true,
        reader: "io_uring O_DIRECT depth 4".into(),
    };
    let p = preamble(
        &config(Mode::Stream(sc)),
        &layout(),
        Some(&reader),
        ContextFacts {
            n_layer: 30,
            n_ctx: 512,
            n_ubatch: 512,
        },
    );
    let want = [
        ("mode", "stream"),
        ("cache_mb", "759"),
        ("o_direct", "1"),
        ("reader", "io_uring O_DIRECT depth 4"),
        ("overlap", "1"),
        ("prefetch", "2"),
        ("n_layer", "30"),
        ("n_ctx", "512"),
        ("ignore_eos", "1"),
        ("lossy", "0"),
        ("spec", "ngram"),
        ("spec_draft_max", "4"),
        ("ngram_min_match", "3"),
    ];
    for (k, v) in want {
        assert_eq!(value(&p, k), v, "{k}");
    }
}

#[test]
fn another_expert_count_is_refused_where_layers_are_routed_by_token_id() {
    let mut cfg = config(Mode::Resident);
    cfg.n_expert_used = Some(2);
    let mut hashed = layout();
    hashed.hash_layers = 3;
    let err = cfg.check_against(&hashed).unwrap_err().to_string();
    assert!(err.contains("drop --n-expert-used"), "{err}");
    cfg.n_expert_used = Some(4);
    assert!(cfg.check_against(&hashed).is_ok());
    cfg.n_expert_used = Some(2);
    assert!(cfg.check_against(&layout()).is_ok());
}

#[test]
fn a_resident_runs_preamble_has_no_reader_and_a_lossy_top_k_is_marked() {
    let mut cfg = config(Mode::Resident);
    cfg.n_expert_used = Some(2);
    let facts = ContextFacts {
        n_layer: 30,
        n_ctx: 512,
        n_ubatch: 512,
    };
    let p = preamble(&cfg, &layout(), None, facts);
    assert_eq!(value(&p, "mode"), "resident");
    assert_eq!(value(&p, "cache_mb"), "0");
    assert_eq!(value(&p, "dense_weights"), "mmap");
    assert_eq!(value(&p, "n_expert_used"), "2");
    assert_eq!(value(&p, "n_expert_used_model"), "4");
    assert_eq!(value(&p, "lossy"), "1");
    assert!(p.iter().all(|(k, _)| k != "reader"));
}
