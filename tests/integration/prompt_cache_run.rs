//! `bmoe run --prompt-cache-file FILE` on the E8K2 fixture: the file is
//! restored and a damaged one refused, a model differing near its end
//! restores nothing, and the model or an input as the file exit 2.

use std::path::Path;

use super::super::common::{self, e8k2};

#[test]
fn run_restores_its_prompt_cache_file_and_refuses_a_damaged_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.bpc");
    let m = e8k2().to_str().unwrap();
    let f = file.to_str().unwrap();
    let run = |c: &str| {
        let args = [
            "run",
            "-m",
            m,
            "-p",
            common::PROSE,
            "-n",
            "6",
            "-t",
            "2",
            "-c",
            c,
        ];
        let o = common::bmoe(&[&args[..], &["--prompt-cache-file", f]].concat());
        assert!(o.status.success(), "{}", common::stderr(&o));
        (common::stdout(&o), common::stderr(&o))
    };
    let (cold, err) = run("256");
    assert!(err.contains("saved to"), "{err}");
    let (warm, err) = run("256");
    assert!(err.contains("prompt tokens restored from"), "{err}");
    assert_eq!(warm, cold, "the same text as a cold prefill");
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&file, bytes).unwrap();
    let (text, err) = run("256");
    assert!(
        err.contains("checksum") && !err.contains("restored from"),
        "{err}"
    );
    assert_eq!(text, cold);
    // Another -c restores the state its tokens fit in.
    let (text, err) = run("512");
    assert!(err.contains("prompt tokens restored from"), "{err}");
    assert_eq!(text, cold);
    std::fs::write(&file, "my notes").unwrap();
    let (text, err) = run("256");
    assert!(err.contains("not a bmoe prompt cache file"), "{err}");
    assert_eq!(
        (text, std::fs::read_to_string(&file).unwrap()),
        (cold, "my notes".into())
    );
}

/// Issue 64, finding 5: a model file of the same size and the same first
/// megabytes, differing only near its end, does not restore the other's
/// state (it did: the identity hashed only the first 4 MiB).
#[test]
fn a_model_differing_only_near_its_end_restores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let twin = dir.path().join("twin.gguf");
    let mut bytes = std::fs::read(e8k2()).unwrap();
    assert!(bytes.len() > 8 << 20, "a fixture past the old 4 MiB hash");
    let at = (bytes.len() - 4096) & !3;
    bytes[at] ^= 0x01;
    std::fs::write(&twin, &bytes).unwrap();
    let file = dir.path().join("prompt.bpc");
    let run = |m: &Path| {
        let args = ["run", "-m", m.to_str().unwrap(), "-p", common::PROSE];
        let rest = ["-n", "4", "-t", "2", "-c", "256", "--prompt-cache-file"];
        let o = common::bmoe(&[&args[..], &rest, &[file.to_str().unwrap()]].concat());
        assert!(o.status.success(), "{}", common::stderr(&o));
        common::stderr(&o)
    };
    assert!(run(e8k2()).contains("saved to"));
    let err = run(&twin);
    assert!(err.contains("another model"), "{err}");
    assert!(!err.contains("restored from"), "{err}");
}

#[test]
fn chat_and_an_input_as_the_cache_file_are_refused_with_exit_2() {
    // chat has no prompt cache flag (/save and --resume keep a conversation's
    // state); run's is --prompt-cache-file, serve's --prompt-cache DIR|off.
    for argv in [
        &["chat", "--prompt-cache", "state.bpc"][..],
        &["chat", "--prompt-cache-file", "state.bpc"],
        &["run", "-p", "hi", "--prompt-cache", "state.bpc"],
    ] {
        let o = common::bmoe(argv);
        assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
        let flag = argv[argv.len() - 2];
        let named = format!("unexpected argument '{flag}'");
        assert!(
            common::stderr(&o).contains(&named),
            "{}",
            common::stderr(&o)
        );
    }
    let m = e8k2().to_str().unwrap();
    let o = common::bmoe(&["run", "-m", m, "-p", "hi", "--prompt-cache-file", m]);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
    assert!(
        common::stderr(&o).contains("own input"),
        "{}",
        common::stderr(&o)
    );
}
