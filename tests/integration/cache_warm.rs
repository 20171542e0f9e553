//! `--cache-warm`: a profile saved by one run warms the next run of another
//! prompt without changing its text; a named profile that is damaged or
//! another model's is refused, `auto` sets it aside and replaces it.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::{e8k2, e8k2_clustered, stderr, stdout, PROSE};

/// `bmoe run` on `model` at a 25% cache with `--cache-warm warm`, the cache
/// directory (where `auto` keeps profiles) being `cache_dir`.
fn run_warm(model: &Path, prompt: &str, n: u32, warm: &str, cache_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["run", "-m", model.to_str().unwrap(), "-p", prompt])
        .args([
            "-n",
            &n.to_string(),
            "--cache-mb",
            "25%",
            "--cache-warm",
            warm,
        ])
        .env("BMOE_CACHE_DIR", cache_dir)
        .env_remove("RUST_LOG")
        .output()
        .expect("start bmoe")
}

/// The number after `key` on the first `moe-cache-warm:` line (`read 12 (`).
fn warm_number(err: &str, key: &str) -> u64 {
    let line = err
        .lines()
        .find(|l| l.starts_with("moe-cache-warm:"))
        .unwrap_or_else(|| panic!("no moe-cache-warm line in\n{err}"));
    let at = line.find(key).unwrap_or_else(|| panic!("{key} in {line}"));
    line[at + key.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a number after {key} in {line}"))
}

#[test]
fn a_profile_warms_the_next_run_of_another_prompt_and_never_changes_its_text() {
    let dir = tempfile::tempdir().unwrap();
    let model = e8k2_clustered();
    let profile = dir.path().join("p.bmws");
    let p = profile.to_str().unwrap();
    let o = run_warm(model, PROSE, 40, p, dir.path());
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("no profile yet"), "{err}");
    assert!(
        err.contains("moe-cache-warm: profile saved: 39 tokens over 1 run(s)"),
        "{err}"
    );
    let prompt = "The capital of France is";
    let cold = run_warm(model, prompt, 16, "off", dir.path());
    assert!(cold.status.success(), "{}", stderr(&cold));
    assert!(
        !stderr(&cold).contains("moe-cache-warm"),
        "off says nothing"
    );
    let warm = run_warm(model, prompt, 16, p, dir.path());
    let err = stderr(&warm);
    assert!(warm.status.success(), "{err}");
    assert_eq!(
        stdout(&warm),
        stdout(&cold),
        "warm start never changes the text"
    );
    assert!(err.contains("profile of 39 tokens over 1 run(s)"), "{err}");
    let (planned, read) = (warm_number(&err, "planned "), warm_number(&err, "read "));
    assert!(planned > 0 && read > 0 && read <= planned, "{err}");
    assert!(warm_number(&err, "used ") > 0, "{err}");
    assert!(err.contains("over 2 run(s)"), "{err}");
    // Auto keeps the profile in the cache directory, named after the model.
    let auto = run_warm(model, PROSE, 12, "auto", dir.path());
    assert!(auto.status.success(), "{}", stderr(&auto));
    let kept: Vec<_> = std::fs::read_dir(dir.path().join("warm"))
        .unwrap()
        .collect();
    assert_eq!(kept.len(), 1, "one profile for the model");
}

#[test]
fn a_named_profile_of_another_model_or_damaged_is_refused_and_auto_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("random-router.bmws");
    let o = run_warm(e8k2(), PROSE, 12, other.to_str().unwrap(), dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let model = e8k2_clustered();
    let o = run_warm(model, PROSE, 4, other.to_str().unwrap(), dir.path());
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("another model"), "{}", stderr(&o));
    let junk = dir.path().join("junk.bmws");
    std::fs::write(&junk, b"not a profile at all").unwrap();
    let o = run_warm(model, PROSE, 4, junk.to_str().unwrap(), dir.path());
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("bad magic"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&junk).unwrap(), b"not a profile at all");
    // Auto: a damaged profile is set aside and this run's replaces it.
    let cache = dir.path().join("cache");
    let o = run_warm(model, PROSE, 12, "auto", &cache);
    assert!(o.status.success(), "{}", stderr(&o));
    let kept = std::fs::read_dir(cache.join("warm"))
        .unwrap()
        .next()
        .unwrap();
    let kept = kept.unwrap().path();
    std::fs::write(&kept, b"BMWS damaged").unwrap();
    let o = run_warm(model, PROSE, 12, "auto", &cache);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("profile set aside"), "{err}");
    assert!(err.contains("over 1 run(s) ->"), "{err}");
    // Nothing to warm without streaming.
    let m = model.to_str().unwrap();
    let o = crate::common::bmoe(&[
        "run",
        "-m",
        m,
        "-p",
        PROSE,
        "--resident",
        "--cache-warm",
        "auto",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}
