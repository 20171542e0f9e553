//! Issue 65: the workspace's crates form no dependency loop, read from
//! their manifests.

use std::path::Path;

/// The workspace crates each names (as a dependency of any kind, dev and
/// build ones too) in its manifest `text`.
fn crate_deps(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_once(" = ").map(|(name, _)| name.trim()))
        .filter(|name| name.starts_with("bmoe-"))
        .map(str::to_string)
        .collect()
}

/// A pair of crates that name each other (a dependency loop, dev ones too).
fn crate_loop(manifests: &[(String, String)]) -> Option<(String, String)> {
    for (a, text_a) in manifests {
        for (b, text_b) in manifests {
            if a < b && crate_deps(text_a).contains(b) && crate_deps(text_b).contains(a) {
                return Some((a.clone(), b.clone()));
            }
        }
    }
    None
}

/// Issue 65: no two crates depend on each other, not even for their tests
/// or benches (bmoe-flash's bench of bmoe-decode's n-gram matcher and
/// bmoe-decode's tests of bmoe-flash's xorshift were one such loop).
#[test]
fn no_two_crates_depend_on_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let manifests: Vec<(String, String)> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .filter_map(|d| {
            let text = std::fs::read_to_string(d.path().join("Cargo.toml")).ok()?;
            let name = text
                .lines()
                .find_map(|l| l.strip_prefix("name = "))?
                .trim_matches('"')
                .to_string();
            Some((name, text))
        })
        .collect();
    assert!(manifests.len() >= 3, "{manifests:?}");
    assert_eq!(crate_loop(&manifests), None);
    let planted = [
        (
            "bmoe-a".to_string(),
            "[dev-dependencies]\nbmoe-b = { path = \"../b\" }\n".to_string(),
        ),
        (
            "bmoe-b".to_string(),
            "[dependencies]\nbmoe-a = { path = \"../a\" }\n".to_string(),
        ),
    ];
    assert_eq!(
        crate_loop(&planted),
        Some(("bmoe-a".into(), "bmoe-b".into()))
    );
}
