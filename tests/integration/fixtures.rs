//! The fixtures themselves: reproducible bytes, loadable models, an MTP context.

use std::sync::Arc;

use bmoe::fixture::upcycle::{self, UpcycleParams};
use bmoe::layout::MoeLayout;
use bmoe::llama::{Context, ContextKind, ContextParams, Model, ModelParams};

use crate::common::{bmoe, fixture_dir, sha256, smollm2, stderr, stdout, tiny_mtp};

#[test]
fn smollm2_fixture_is_the_checked_file() {
    assert_eq!(sha256(smollm2()), bmoe::fixture::smollm2::SHA256);
}

#[test]
fn upcycle_is_byte_reproducible_and_seeded() {
    let dir = tempfile::tempdir_in(fixture_dir()).unwrap();
    let small = |seed: u64, name: &str| {
        let out = dir.path().join(name);
        let o = bmoe(&[
            "fixture",
            "upcycle",
            "--from",
            smollm2().to_str().unwrap(),
            "--experts",
            "2",
            "--top-k",
            "1",
            "--seed",
            &seed.to_string(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout(&o).trim(), out.to_str().unwrap());
        assert!(
            stderr(&o).contains("100%"),
            "progress shown: {}",
            stderr(&o)
        );
        out
    };
    let a = small(7, "a.gguf");
    let b = small(7, "b.gguf");
    let c = small(8, "c.gguf");
    assert_eq!(sha256(&a), sha256(&b), "same arguments, same bytes");
    assert_ne!(sha256(&a), sha256(&c), "another seed, another file");
    let l = MoeLayout::open(&a).unwrap();
    assert_eq!((l.n_expert, l.n_expert_used, l.n_layer), (2, 1, 30));
    // Every expert slice starts on a page boundary (O_DIRECT-friendly).
    for e in &l.experts {
        assert_eq!(e.file_offset % 4096, 0, "{}", e.name);
        assert_eq!(e.slice_bytes % 4096, 0, "{}", e.name);
    }
}

#[test]
fn upcycle_refuses_bad_arguments_and_models() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let bad_k = UpcycleParams {
        experts: 4,
        top_k: 5,
        ..Default::default()
    };
    let e = upcycle::upcycle(smollm2(), &out, &bad_k)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--top-k 5"), "{e}");
    // An MoE cannot be upcycled again.
    let moe = crate::common::e8k2();
    let e = upcycle::upcycle(moe, &out, &UpcycleParams::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("already a MoE"), "{e}");
    assert!(!out.exists());
}

#[test]
fn tiny_mtp_loads_with_mtp_and_an_mtp_context_is_created() {
    let path = tiny_mtp(0.0, 0.0);
    let l = MoeLayout::open(&path).unwrap();
    assert_eq!(l.arch, "qwen35moe");
    assert_eq!(
        (l.n_layer, l.n_layer_nextn, l.n_expert, l.n_expert_used),
        (2, 1, 8, 2)
    );
    // The MTP block's experts are streamable like the trunk's.
    assert_eq!(l.expert_layers(), vec![0, 1, 2]);
    let model = Arc::new(
        Model::load(
            &path,
            &ModelParams {
                load_mtp: true,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    assert_eq!(model.n_layer(), 2);
    assert_eq!(model.n_layer_nextn(), 1);
    let _target = Context::new(model.clone(), ContextParams::default()).unwrap();
    let _draft = Context::new(
        model.clone(),
        ContextParams {
            kind: ContextKind::Mtp,
            n_ctx: 512,
            n_batch: 32,
            n_ubatch: 32,
            ..Default::default()
        },
    )
    .unwrap();
}

#[test]
fn mtp_context_on_a_model_without_nextn_is_a_clear_error() {
    let model = Arc::new(Model::load(smollm2(), &ModelParams::default()).unwrap());
    let e = Context::new(
        model,
        ContextParams {
            kind: ContextKind::Mtp,
            ..Default::default()
        },
    )
    .err()
    .expect("no MTP layers");
    assert!(e.to_string().contains("no MTP (nextn) layers"), "{e}");
}

#[test]
fn tiny_mtp_is_reproducible_and_its_knobs_change_the_head() {
    let a = tiny_mtp(0.0, 0.0);
    let dir = tempfile::tempdir_in(fixture_dir()).unwrap();
    let again = dir.path().join("again.gguf");
    let o = bmoe(&[
        "fixture",
        "tiny-mtp",
        "--tokenizer-from",
        smollm2().to_str().unwrap(),
        "-o",
        again.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(sha256(&a), sha256(&again));
    let noisy = tiny_mtp(2.0, 0.0);
    assert_ne!(sha256(&a), sha256(&noisy));
}

#[test]
fn tiny_mtp_generates_through_the_trunk() {
    let o = bmoe(&[
        "run",
        "-m",
        tiny_mtp(0.0, 0.25).to_str().unwrap(),
        "-p",
        "Hello world",
        "-n",
        "12",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("12 generated"), "{}", stderr(&o));
}
