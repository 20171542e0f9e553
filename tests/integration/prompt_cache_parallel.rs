//! The prompt cache across `--parallel` counts: two agents at once under
//! `--parallel 2`, and a cache filled at `--parallel 1` restored at
//! `--parallel 2` (a sequence's state is kept as one KV stream's and
//! widened to the context's streams when restored).

use std::path::Path;

use super::{ask, conversation, start};

/// `src`'s cache folders copied into `dst` (a second server's start from
/// the same cache).
pub(super) fn copy_cache(src: &Path, dst: &Path) {
    for e in std::fs::read_dir(src).unwrap().flatten() {
        if e.path().is_dir() {
            let to = dst.join(e.file_name());
            std::fs::create_dir_all(&to).unwrap();
            for f in std::fs::read_dir(e.path()).unwrap().flatten() {
                std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
            }
        }
    }
}

/// Issue 67: two agents' turns at once under `--parallel 2` each restore
/// their own prefix from the cache and write the text each writes alone
/// from the same cache at `--parallel 1`. (Not a cold prefill's text: a prompt prefilled in
/// two pieces is not bit-identical to one prefilled whole, so greedy text
/// may differ at a near tie, as batched rows do.)
#[test]
fn two_agents_at_once_restore_their_prefixes_and_write_their_own_text() {
    let (dir, copy) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = |q: &str| conversation(&[q]);
    let (qa, qb) = (
        "Which clouds bring hail to the Alps in July?",
        "How does a barometer predict a storm at sea?",
    );
    let two = ["--parallel", "2"];
    let s = start(dir.path(), &two);
    let (ra, pa, _) = ask(&s, &first(qa));
    let (rb, pb, _) = ask(&s, &first(qb));
    assert!(s.terminate(30).success());
    copy_cache(dir.path(), copy.path());
    let next = |q: &str, r: &str| conversation(&[q, r, "And what should I do then?"]);
    let (na, nb) = (next(qa, &ra), next(qb, &rb));
    let alone = start(copy.path(), &[]);
    let alone = [ask(&alone, &na), ask(&alone, &nb)];

    let s = std::sync::Arc::new(start(dir.path(), &two));
    let at_once: Vec<(String, u64, u64)> = [na, nb]
        .into_iter()
        .map(|m| {
            let s = s.clone();
            std::thread::spawn(move || ask(&s, &m))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    for (together, (alone, first_prompt)) in at_once.iter().zip(alone.iter().zip([pa, pb])) {
        let (_, prompt, restored) = together;
        assert!(
            *restored >= first_prompt - 1 && restored < prompt,
            "{restored} of {prompt}"
        );
        assert_eq!(
            together, alone,
            "the text, prompt and restored tokens it gets alone"
        );
    }
}

/// A cache filled at `--parallel 1` restores at `--parallel 2` (it did not:
/// llama.cpp refused the state, "n_stream mismatch", and the prompt was
/// prefilled), and the reply is the text the same request gets from a
/// `--parallel 2` server restoring a cache filled at `--parallel 2`: the
/// same cells restored, the same rows prefilled after them. Measured on
/// E8K2: equal, "You should check your weather forecast before you".
#[test]
fn a_cache_filled_at_parallel_1_restores_at_parallel_2() {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let q = "Which clouds bring hail to the Alps in July?";
    let par2 = ["--parallel", "2"];
    let s = start(one.path(), &[]);
    let (reply, first_prompt, _) = ask(&s, &conversation(&[q]));
    assert!(s.terminate(30).success());
    let s = start(two.path(), &par2);
    let (reply2, _, _) = ask(&s, &conversation(&[q]));
    assert!(s.terminate(30).success());
    assert_eq!(reply2, reply, "a request alone: the same text");
    let next = conversation(&[q, &reply, "And what should I do then?"]);
    let restore = |dir: &Path, extra: &[&str]| {
        let s = start(dir, extra);
        let got = ask(&s, &next);
        assert!(s.terminate(30).success());
        got
    };
    let from_one = restore(one.path(), &par2);
    let (_, prompt, restored) = from_one;
    assert!(
        restored >= first_prompt - 1 && restored < prompt,
        "{restored} of {prompt}"
    );
    let from_two = restore(two.path(), &par2);
    assert_eq!(
        from_one, from_two,
        "the text, prompt and restored tokens of a --parallel 2 cache"
    );
    // And back: a --parallel 2 cache restores at --parallel 1.
    let (_, _, restored) = restore(two.path(), &[]);
    assert!(restored >= first_prompt - 1, "{restored}");
}
