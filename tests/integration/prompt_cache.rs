//! The prompt cache on the E8K2 fixture: `bmoe serve --prompt-cache DIR`
//! (a restored prefix answers as a cold prefill, after a restart too; damaged
//! or foreign files are warnings; the cap; two servers on one directory);
//! `--parallel` in prompt_cache_parallel.rs, `bmoe run --prompt-cache-file
//! FILE` in prompt_cache_run.rs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::common::e8k2;
use super::serve::Server;

#[path = "prompt_cache_parallel.rs"]
mod parallel;
#[path = "prompt_cache_run.rs"]
mod run_file;

const SYSTEM: &str = "You are a careful assistant for a small weather station. Answer in short, \
    polite sentences, give temperatures in degrees Celsius and say when you are unsure.";

/// A conversation: the system prompt, then user and assistant turns.
fn conversation(turns: &[&str]) -> Vec<Value> {
    let mut m = vec![json!({"role": "system", "content": SYSTEM})];
    for (i, t) in turns.iter().enumerate() {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        m.push(json!({"role": role, "content": t}));
    }
    m
}

/// The reply's text, its prompt tokens and its cached tokens (OpenAI route).
fn ask(s: &Server, messages: &[Value]) -> (String, u64, u64) {
    let body = json!({"messages": messages, "max_tokens": 8});
    let (status, v) = s.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    let u = &v["usage"];
    (
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

/// The reply's text and its cache_read_input_tokens (Anthropic route).
fn ask_anthropic(s: &Server, messages: &[Value]) -> (String, u64) {
    let body = json!({"system": SYSTEM, "messages": &messages[1..], "max_tokens": 8});
    let (status, v) = s.post("/v1/messages", &body);
    assert_eq!(status, 200, "{v}");
    let text = v["content"][0]["text"].as_str().unwrap_or("").to_string();
    (
        text,
        v["usage"]["cache_read_input_tokens"].as_u64().unwrap(),
    )
}

fn metric(s: &Server, name: &str) -> u64 {
    let (_, text) = s.request("GET", "/metrics", "", &[]);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

fn start(dir: &Path, extra: &[&str]) -> Server {
    let mut args = vec!["--prompt-cache", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// Every entry file in the cache directory's folders (entries and any
/// temporary ones, `*.bpc`; not the folders' markers, nor the expert sets at
/// its top).
fn files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|d| d.path().is_dir())
        .flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten())
        .map(|f| f.path())
        .filter(|p| p.extension().is_some_and(|e| e == "bpc") && p.is_file())
        .collect()
}

/// The expert sets at the cache directory's top.
fn expert_sets(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|f| f.path())
        .filter(|p| p.extension().is_some_and(|e| e == "slots"))
        .collect()
}

/// The server's log lines, from its start, until every one of `wanted` has
/// been seen (within 30 s: a hang fails).
pub(super) fn log_has(s: &Server, wanted: &[&str]) -> Vec<String> {
    let t0 = Instant::now();
    let mut lines = s.started.clone();
    let log = s.log.lock().unwrap();
    while !wanted
        .iter()
        .all(|w| lines.iter().any(|l: &String| l.contains(w)))
    {
        let left = Duration::from_secs(30).saturating_sub(t0.elapsed());
        match log.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(_) => panic!("{wanted:?} not all in the log: {lines:#?}"),
        }
    }
    lines
}

#[test]
fn a_restored_prefix_answers_as_a_cold_prefill_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let first = conversation(&["What is the weather like today in Paris?"]);
    // Streamed (E8K2 fits, so the default would run it resident): the expert
    // slots held at the stop are kept beside the prompt states.
    let streamed = ["--cache-mb", "auto"];
    let a = start(dir.path(), &streamed);
    let (reply, p1, cached) = ask(&a, &first);
    assert_eq!(cached, 0, "nothing cached yet");
    assert!(a.terminate(30).success());
    assert!(!files(dir.path()).is_empty(), "the state was written");
    assert_eq!(expert_sets(dir.path()).len(), 1, "the expert set was kept");

    let second = conversation(&[
        "What is the weather like today in Paris?",
        &reply,
        "And tomorrow?",
    ]);
    let b = start(dir.path(), &[&streamed[..], &["-v"]].concat());
    // The expert slots the first server held are read back in the background.
    log_has(&b, &["expert slots held at the last stop queued to read"]);
    let (warm, p2, restored) = ask(&b, &second);
    assert!(
        restored >= p1 - 1 && restored < p2,
        "{restored} of {p2} (first prompt {p1})"
    );
    assert_eq!(metric(&b, "bmoe_prompt_tokens_restored_total"), restored);
    assert_eq!(
        metric(&b, "bmoe_prompt_tokens_prefilled_total"),
        p2 - restored
    );
    assert!(metric(&b, "bmoe_prompt_cache_read_bytes_total") > 0);
    let (warm_a, cache_read) = ask_anthropic(&b, &second);
    assert!(cache_read > 0);

    let cold = Server::start(&[&streamed[..], &["--prompt-cache", "off"]].concat());
    assert_eq!(
        ask(&cold, &second),
        (warm, p2, 0),
        "the same text as a cold prefill"
    );
    assert_eq!(ask_anthropic(&cold, &second).0, warm_a);
}

#[test]
fn foreign_truncated_or_flipped_files_are_warnings_and_the_reply_is_cold() {
    use bmoe::prompt_cache::{read_any_entry, write_entry, Ident};
    let dir = tempfile::tempdir().unwrap();
    let first = conversation(&["Is it going to rain in Lyon this evening?"]);
    let a = start(dir.path(), &[]);
    let (reply, _, _) = ask(&a, &first);
    assert!(a.terminate(30).success());
    let [good] = &files(dir.path())[..] else {
        panic!("one entry: {:?}", files(dir.path()))
    };
    let e = read_any_entry(good).unwrap();
    let folder = good.parent().unwrap();
    let other_model = Ident {
        model_hash: "f".repeat(64),
        ..e.ident.clone()
    };
    let other_par = Ident {
        state_streams: 2,
        ..e.ident.clone()
    };
    write_entry(&folder.join("model.bpc"), &other_model, &e.tokens, &e.state).unwrap();
    write_entry(&folder.join("par.bpc"), &other_par, &e.tokens, &e.state).unwrap();
    let short = &e.tokens[..e.tokens.len() - 2];
    write_entry(&folder.join("cut.bpc"), &e.ident, short, &e.state).unwrap();
    let cut = std::fs::read(folder.join("cut.bpc")).unwrap();
    std::fs::write(folder.join("cut.bpc"), &cut[..cut.len() / 2]).unwrap();
    let mut flipped = std::fs::read(good).unwrap();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x10;
    std::fs::write(folder.join("flip.bpc"), flipped).unwrap();
    std::fs::remove_file(good).unwrap();
    // Finding 9: many foreign files are one warning, not one (or two) each.
    for i in 0..40 {
        write_entry(
            &folder.join(format!("junk{i}.bpc")),
            &other_model,
            &[i],
            &[0],
        )
        .unwrap();
    }

    let b = start(dir.path(), &[]);
    let (text, _, cached) = ask(&b, &first);
    assert_eq!((text, cached), (reply, 0), "a plain prefill's reply");
    let lines = log_has(
        &b,
        &[
            "another model",
            "another --parallel",
            "checksum",
            "truncated",
        ],
    );
    assert!(b.terminate(30).success());
    let summaries = lines
        .iter()
        .filter(|l| l.contains("ignored, damaged"))
        .count();
    assert_eq!(summaries, 1, "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("42 file(s)")), "{lines:#?}");
}

#[test]
fn the_directory_never_grows_past_its_cap() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 3u64 << 20;
    let s = start(dir.path(), &["--prompt-cache-mb", "3"]);
    let cities = ["Paris", "Lyon", "Nice", "Lille", "Brest"];
    for city in cities {
        ask(
            &s,
            &conversation(&[&format!("Will it be sunny in {city} tomorrow?")]),
        );
        assert!(bmoe::prompt_cache::dir_bytes(dir.path()) <= cap);
    }
    assert!(s.terminate(30).success());
    let n = files(dir.path()).len();
    assert!(n >= 1 && n < cities.len(), "{n} files: the oldest went");
    assert!(bmoe::prompt_cache::dir_bytes(dir.path()) <= cap);
}

/// Issue 64, finding 1: a cache directory that also holds the served model,
/// another tool's folder, documents and a symlinked folder: eviction under a
/// small cap removes only the cache's own entries, and every reply is a 200.
#[test]
fn eviction_in_a_shared_directory_leaves_the_model_and_the_users_files() {
    let d = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let model = d.path().join("bmoe/model.gguf");
    std::fs::create_dir_all(model.parent().unwrap()).unwrap();
    std::fs::copy(e8k2(), &model).unwrap();
    let decoys = [
        d.path().join("pip/x.json"),
        d.path().join("Documents/letter.docx"),
        d.path().join("notes.txt"),
        outside.path().join("thesis.docx"),
    ];
    for f in &decoys {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, b"{}").unwrap();
    }
    std::os::unix::fs::symlink(outside.path(), d.path().join("linked")).unwrap();
    let model_bytes = std::fs::read(&model).unwrap();
    let dir = d.path().to_str().unwrap();
    let cache = [
        "--prompt-cache",
        dir,
        "--prompt-cache-mb",
        "3",
        "--prompt-cache-ram-mb",
        "0",
    ];
    let s = Server::start_on(&model, &cache);
    let mut fifos = Vec::new();
    for city in ["Paris", "Lyon", "Nice", "Lille"] {
        ask(
            &s,
            &conversation(&[&format!("Is it windy in {city} today?")]),
        );
        if fifos.is_empty() {
            // Finding 4: a FIFO named like an entry in the cache's folder is
            // skipped, never opened (every request after it blocked).
            fifos = plant_fifos(d.path());
        }
    }
    assert!(s.terminate(30).success());
    assert!(!fifos.is_empty() && fifos.iter().all(|f| f.exists()));
    assert!(!files(d.path()).is_empty(), "the cache did write entries");
    assert_eq!(std::fs::read(&model).unwrap(), model_bytes, "the model");
    for f in &decoys {
        assert_eq!(std::fs::read(f).unwrap(), b"{}", "{}", f.display());
    }
}

/// A FIFO named `fifo.bpc` in each folder holding entries under `dir`.
fn plant_fifos(dir: &Path) -> Vec<PathBuf> {
    let mut folders: Vec<PathBuf> = files(dir)
        .iter()
        .filter_map(|f| f.parent().map(Path::to_path_buf))
        .collect();
    folders.dedup();
    folders
        .into_iter()
        .map(|f| {
            let fifo = f.join("fifo.bpc");
            super::errors_paths::mkfifo(&fifo);
            fifo
        })
        .collect()
}

#[test]
fn two_servers_sharing_a_directory_leave_only_whole_entries() {
    let dir = tempfile::tempdir().unwrap();
    // One thread each: two servers of two threads computing at once on a
    // 2-core host spent 22-63 s here, their thread pools fighting for the cores.
    let one = ["-t", "1"];
    let (a, b) = (start(dir.path(), &one), start(dir.path(), &one));
    let ask_all = |s: &Server, who: &str| {
        (0..3)
            .map(|i| {
                let q = format!("{who} asks: how windy is it on day {i}?");
                (q.clone(), ask(s, &conversation(&[&q])).0)
            })
            .collect::<Vec<_>>()
    };
    let (from_a, _) = std::thread::scope(|sc| {
        let ta = sc.spawn(|| ask_all(&a, "Ann"));
        let tb = sc.spawn(|| ask_all(&b, "Bob"));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    assert!(a.terminate(30).success() && b.terminate(30).success());
    let all = files(dir.path());
    assert!(!all.is_empty());
    for f in &all {
        assert_eq!(
            f.extension().unwrap(),
            "bpc",
            "no temporary file left: {f:?}"
        );
        bmoe::prompt_cache::read_any_entry(f).unwrap_or_else(|e| panic!("{e}"));
    }
    let c = start(dir.path(), &[]);
    let (q, text) = &from_a[0];
    let (again, _, cached) = ask(&c, &conversation(&[q]));
    assert!(cached > 0, "restored from the shared directory");
    assert_eq!(&again, text);
}

/// A tmpfs of `kib` KiB mounted at `dir` for the test's life (None, with the
/// reason printed, where this host cannot mount one: not root, no tmpfs).
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, kib: u32) -> Option<Self> {
        let size = format!("size={kib}k");
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "bmoe-small-disk"])
            .arg(dir)
            .stderr(std::process::Stdio::piped())
            .output();
        match st {
            Ok(o) if o.status.success() => Some(Self(dir.to_path_buf())),
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr);
                eprintln!(
                    "skipped: cannot mount a {kib} KiB tmpfs here ({})",
                    why.trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount ({e})");
                None
            }
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A disk too small for one state (a 64 KiB tmpfs, where a state of this
/// conversation is over 1 MiB): each write fails with a warning, the replies
/// are the cold server's, the RAM tier still restores, and nothing
/// half-written is left in the directory.
#[test]
fn a_full_disk_is_a_warning_and_the_replies_stay_right() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_disk) = SmallDisk::mount(dir.path(), 64) else {
        return;
    };
    let first = conversation(&["What is the weather like today in Paris?"]);
    let s = start(dir.path(), &[]);
    let (reply, p1, cached) = ask(&s, &first);
    assert_eq!(cached, 0);
    let lines = log_has(&s, &["kept in RAM only"]);
    assert!(
        lines.iter().any(|l| l.contains("No space left")),
        "the warning names the full disk: {lines:#?}"
    );
    let (again, _, restored) = ask(&s, &first);
    assert_eq!(again, reply, "the RAM tier's restore writes the same text");
    assert!(restored + 1 >= p1, "restored {restored} of {p1} from RAM");
    assert_eq!(metric(&s, "bmoe_prompt_cache_written_bytes_total"), 0);
    assert!(s.terminate(30).success());
    let left: Vec<_> = files(dir.path());
    assert!(left.is_empty(), "nothing half-written is left: {left:?}");
    let cold = Server::start(&["--prompt-cache", "off"]);
    assert_eq!(ask(&cold, &first).0, reply, "the cold server's text");
}

/// The cached tokens of a chat request sent with `key` (and `user`).
fn cached_as(s: &Server, key: &str, user: &str, messages: &[Value]) -> u64 {
    let body = json!({"messages": messages, "max_tokens": 2, "user": user});
    let auth = format!("Authorization: Bearer {key}");
    let (status, text) = s.request("POST", "/v1/chat/completions", &body.to_string(), &[&auth]);
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

/// Issue 64, finding 8: one key's prompts are never reused for another
/// key's requests (`cached_tokens` told another client a PIN digit by
/// digit), neither from a KV sequence nor from the cache after a restart;
/// `--prompt-cache-scope user` splits a key by `user` too; entry files are
/// private.
#[test]
fn one_keys_prompts_are_never_reused_for_another_key() {
    let dir = tempfile::tempdir().unwrap();
    let keys = ["--api-key", "key-of-ann", "--api-key", "key-of-bob"];
    let secret = conversation(&["My bank PIN is 4821, please remember it for me."]);
    let s = start(dir.path(), &keys);
    assert_eq!(cached_as(&s, "key-of-ann", "ann", &secret), 0);
    assert_eq!(cached_as(&s, "key-of-bob", "bob", &secret), 0, "ann's");
    assert!(cached_as(&s, "key-of-bob", "bob", &secret) > 0, "bob's own");
    assert!(s.terminate(30).success());
    let s = start(dir.path(), &keys[2..]);
    let guess = conversation(&["My bank PIN is 4822, please remember it for me."]);
    let bob_own = cached_as(&s, "key-of-bob", "bob", &guess);
    assert!(s.terminate(30).success());
    let s = start(dir.path(), &keys);
    assert!(
        cached_as(&s, "key-of-ann", "ann", &secret) > bob_own,
        "ann's own, restored"
    );
    assert!(s.terminate(30).success());
    for f in files(dir.path()) {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&f).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", f.display());
    }
    let by_user = [&keys[..2], &["--prompt-cache-scope", "user"]].concat();
    let s = start(dir.path(), &by_user);
    let other = conversation(&["My locker code is 1234, please remember it."]);
    assert_eq!(cached_as(&s, "key-of-ann", "ann", &other), 0);
    assert_eq!(
        cached_as(&s, "key-of-ann", "eve", &other),
        0,
        "ann's, another user"
    );
    assert!(cached_as(&s, "key-of-ann", "ann", &other) > 0);
}

/// Issue 64, finding 9: a cache directory that cannot be made keeps the RAM
/// tier (a read-only one turned the whole cache off).
#[test]
fn an_unusable_directory_keeps_the_ram_tier() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let s = start(&file.join("cache"), &[]);
    let a = conversation(&["Will it snow in Grenoble this weekend?"]);
    let b = conversation(&["How warm is the sea in Marseille in June?"]);
    ask(&s, &a);
    ask(&s, &b);
    let (_, _, cached) = ask(&s, &a);
    assert!(cached > 0, "restored from RAM");
    // Only the cache restores (a sequence's own reuse is not counted here).
    assert!(metric(&s, "bmoe_prompt_tokens_restored_total") > 0);
}
