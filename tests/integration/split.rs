//! Models split over several files (llama.cpp's `PREFIX-0000K-of-0000N.gguf`):
//! streamed from their shards with the single file's text; a broken set of
//! shards is refused before loading, naming the shard.

use std::path::{Path, PathBuf};

use crate::common::{bmoe, fixture_dir, stderr, stdout};

/// `bmoe fixture zoo --family qwen3moe` at `out`, split in `split` shards
/// when given; the path to give `-m`.
fn zoo(out: &Path, split: Option<u32>) -> PathBuf {
    let mut args = vec!["fixture", "zoo", "--family", "qwen3moe", "-o"];
    args.push(out.to_str().unwrap());
    let n = split.map(|n| n.to_string());
    if let Some(n) = &n {
        args.extend(["--split", n]);
    }
    let o = bmoe(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let first = stdout(&o).lines().next().unwrap().to_string();
    PathBuf::from(first)
}

fn tokens(model: &Path, flags: &[&str]) -> String {
    let m = model.to_str().unwrap();
    let mut args = vec!["run", "-m", m, "-p", "Hello world", "-n", "32"];
    args.extend(["--ignore-eos"]);
    args.extend_from_slice(flags);
    let o = bmoe(&args);
    assert!(o.status.success(), "{m} {flags:?}: {}", stderr(&o));
    stdout(&o)
}

#[test]
fn a_split_model_streams_with_its_single_files_text() {
    let dir = tempfile::tempdir_in(fixture_dir()).unwrap();
    let single = zoo(&dir.path().join("one.gguf"), None);
    let first = zoo(&dir.path().join("ds.gguf"), Some(3));
    assert!(first.ends_with("ds-00001-of-00003.gguf"), "{first:?}");
    let layout = bmoe::layout::MoeLayout::open(&first).unwrap();
    assert_eq!(layout.shards.len(), 3);
    let shards_with_experts = (0..3)
        .filter(|&i| layout.experts.iter().any(|e| e.shard == i))
        .count();
    assert!(shards_with_experts >= 2, "experts in one shard only");
    let resident = tokens(&single, &["--resident"]);
    assert_eq!(tokens(&first, &["--resident"]), resident);
    for flags in [
        &["--cache-mb", "0"][..],
        &["--cache-mb", "0", "--overlap"],
        &["--cache-mb", "0", "--dense-weights", "anon"],
    ] {
        assert_eq!(tokens(&first, flags), resident, "{flags:?}");
    }
    let o = bmoe(&["inspect", first.to_str().unwrap()]);
    let out = stdout(&o);
    assert!(out.contains("shards:           3"), "{out}");
    assert!(out.contains("read from 3 shards"), "{out}");
}

fn assert_refused(model: &Path, code: i32, needles: &[&str]) {
    let o = bmoe(&["run", "-m", model.to_str().unwrap(), "-p", "hi", "-n", "2"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(code), "{err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} not in {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_broken_split_is_refused_naming_the_shard() {
    let dir = tempfile::tempdir_in(fixture_dir()).unwrap();
    let first = zoo(&dir.path().join("m.gguf"), Some(3));
    let shard = |k: u32| dir.path().join(format!("m-0000{k}-of-00003.gguf"));
    // Not the first shard.
    assert_refused(&shard(2), 4, &["give the first shard"]);
    // Truncated.
    let bytes = std::fs::read(shard(3)).unwrap();
    std::fs::write(shard(3), &bytes[..bytes.len() - 100]).unwrap();
    assert_refused(&first, 4, &["m-00003-of-00003.gguf", "truncated"]);
    std::fs::write(shard(3), &bytes).unwrap();
    // A shard of another split in its place.
    let other = zoo(&dir.path().join("o.gguf"), Some(2));
    let second_of_two = other.to_str().unwrap().replace("00001-of", "00002-of");
    std::fs::copy(&second_of_two, shard(3)).unwrap();
    assert_refused(&first, 4, &["m-00003-of-00003.gguf", "another split"]);
    std::fs::write(shard(3), &bytes).unwrap();
    // Missing.
    std::fs::remove_file(shard(2)).unwrap();
    assert_refused(&first, 3, &["shard 2 of 3 of a split model is missing"]);
}
