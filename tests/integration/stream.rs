//! Expert streaming on real models: byte identity with the resident path,
//! exact accounting, the memory budget, and the refusals.

use bmoe::engine::{self, Mode};
use bmoe::stream::{CacheSize, DenseMode, StreamConfig};

use crate::common::{
    bmoe, e8k2, e8k2_cli, e8k2_config as cfg, e8k2_run as run, smollm2, stderr, summary_number,
    PROSE,
};

fn stream(cache_mb: u64, o_direct: bool) -> Mode {
    Mode::Stream(StreamConfig {
        cache: CacheSize::Mib(cache_mb),
        o_direct,
        dense: DenseMode::Warm,
        ..StreamConfig::default()
    })
}

#[test]
fn streamed_tokens_equal_resident_tokens_for_every_cache_setting() {
    // 16 greedy tokens of prose, which a wrong expert byte would change; the
    // 64 MiB cache evicts within the first token (a token routes 95 MiB of
    // experts), and with room for every expert the experts reused hit.
    let n = 16;
    let resident = run(Mode::Resident, n);
    assert_eq!(
        resident.generation.tokens.len(),
        n as usize,
        "prose runs to the limit"
    );
    for (name, mode) in [
        ("cache 0", stream(0, true)),
        ("cache 64 MiB (evicts every token)", stream(64, true)),
        ("cache larger than all experts", stream(100_000, true)),
        ("cache 0, buffered reads", stream(0, false)),
        (
            "cache 0, overlap",
            Mode::Stream(StreamConfig {
                cache: CacheSize::Mib(0),
                overlap: true,
                ..StreamConfig::default()
            }),
        ),
        (
            "cache 64 MiB, overlap, queue depth 8",
            Mode::Stream(StreamConfig {
                cache: CacheSize::Mib(64),
                overlap: true,
                io_threads: 8,
                ..StreamConfig::default()
            }),
        ),
        (
            "cache 0, dense weights in anonymous memory",
            Mode::Stream(StreamConfig {
                cache: CacheSize::Mib(0),
                dense: DenseMode::Anon,
                ..StreamConfig::default()
            }),
        ),
    ] {
        let r = run(mode, n);
        assert_eq!(r.mode, "stream");
        assert_eq!(
            r.generation.tokens, resident.generation.tokens,
            "{name}: token ids differ from --resident"
        );
        let hits: u64 = r.rows.iter().map(|x| x.reads.hits).sum();
        // The prompt's hits are its next-layer read-ahead; between tokens a
        // zero budget keeps nothing.
        let decode_hits: u64 = r
            .rows
            .iter()
            .filter(|x| !x.prefill)
            .map(|x| x.reads.hits)
            .sum();
        let evictions: u64 = r.rows.iter().map(|x| x.reads.evictions).sum();
        match name {
            "cache 0" => assert_eq!(decode_hits, 0, "{name}: nothing survives a zero budget"),
            "cache 64 MiB (evicts every token)" => assert!(evictions > 0, "{name}"),
            "cache larger than all experts" => {
                assert_eq!(evictions, 0, "{name}");
                assert!(hits > 0, "{name}");
            }
            _ => {}
        }
    }
}

/// "read X MiB (Y MiB/token decode), kernel read_bytes Z MiB" from the summary.
fn stream_numbers(err: &str) -> (f64, f64, f64) {
    let n = |key| summary_number(err, "moe-stream:", key);
    (n("read "), n("MiB ("), n("kernel read_bytes "))
}

#[test]
fn flash_accounting_matches_the_kernel_and_the_layout() {
    let o = e8k2_cli(PROSE, 24, &["--cache-mb", "0"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let (flash_mib, per_token_mib, kernel_mib) = stream_numbers(&err);
    // O_DIRECT reads all reach the device: the kernel's count matches ours within 2%.
    assert!((kernel_mib - flash_mib).abs() <= 0.02 * flash_mib, "{err}");
    // 30 layers x k=2 x (3 x 552960 bytes) per decoded token, within 5%.
    let expect = 30.0 * 2.0 * 3.0 * 552960.0 / (1024.0 * 1024.0);
    assert!(
        (per_token_mib - expect).abs() <= 0.05 * expect,
        "{per_token_mib} vs {expect}\n{err}"
    );
}

/// "peak resident X MiB, peak RSS during generation Y MiB (dense Z MiB)".
fn cache_numbers(err: &str) -> (f64, f64, f64) {
    let n = |key| summary_number(err, "moe-cache:", key);
    (
        n("peak resident "),
        n("peak RSS during generation "),
        n("(dense "),
    )
}

/// RSS is per process, so each cell runs as its own `bmoe` process.
#[test]
fn the_cache_stays_within_its_budget_and_rss_follows_it() {
    let cell = |mb: &str| {
        let o = e8k2_cli(PROSE, 24, &["--cache-mb", mb]);
        assert!(o.status.success(), "{}", stderr(&o));
        cache_numbers(&stderr(&o))
    };
    let (_, rss0, dense) = cell("0");
    let (peak, rss64, _) = cell("64");
    // The budget is never exceeded, and it is used.
    assert!(peak <= 64.0, "peak resident {peak} MiB");
    assert!(peak > 32.0, "peak resident {peak} MiB");
    // RSS follows the budget: the 64 MiB cache costs at most its budget more than
    // the zero-budget run (plus 16 MiB of noise), never the experts' 380 MiB.
    assert!(
        rss64 <= rss0 + 64.0 + 16.0,
        "rss {rss64} MiB vs {rss0} MiB with no cache"
    );
    // Zero budget: dense + llama.cpp's buffers (~75 MiB here) + slack.
    assert!(
        rss0 <= dense + 250.0,
        "zero-budget RSS {rss0} MiB, dense {dense} MiB"
    );
}

#[test]
fn a_dense_model_runs_resident_with_a_note_and_refuses_moe_stream() {
    let m = smollm2().to_str().unwrap();
    let o = bmoe(&["run", "-m", m, "-p", "Hello", "-n", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("note: dense model"), "{}", stderr(&o));
    let o = bmoe(&["run", "-m", m, "-p", "Hello", "-n", "4", "--moe-stream"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("drop --moe-stream"), "{}", stderr(&o));
}

#[test]
fn a_cache_larger_than_memory_is_refused_with_what_fits() {
    let mut big = cfg(stream(1 << 30, true), 4);
    // E8K2's experts are 380 MiB: shrink "available memory" by asking the library directly.
    let layout = bmoe::layout::MoeLayout::open(&big.model).unwrap();
    let e = bmoe::stream::resolve_cache_bytes(
        &StreamConfig {
            cache: CacheSize::Mib(300),
            ..StreamConfig::default()
        },
        &layout,
        Some(600 * 1024 * 1024),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("at most 42 MiB fits"), "{e}");
    // Through the CLI, with the real MemAvailable: a budget bigger than all experts is
    // capped to them (not refused), so refuse via a model-independent huge number only
    // when memory is really short; here just check `auto` resolves within the ceiling.
    big.mode = Mode::Stream(StreamConfig {
        cache: CacheSize::Auto,
        cache_ceil_mb: Some(100),
        ..StreamConfig::default()
    })
    .into();
    let r = engine::run(&big, |_| {}).unwrap();
    assert_eq!(r.memory.cache_budget_bytes, 100 * 1024 * 1024);
    let how = r.notes.iter().find_map(|n| match n {
        engine::Note::CacheAuto(_) => Some(n.to_string()),
        _ => None,
    });
    assert!(
        how.is_some_and(|n| n.ends_with("capped by --cache-ceil-mb 100: 100 MiB")),
        "{:?}",
        r.notes
    );
}

#[test]
fn streaming_flags_conflict_with_resident() {
    let o = bmoe(&[
        "run",
        "-m",
        e8k2().to_str().unwrap(),
        "-p",
        "x",
        "--resident",
        "--cache-mb",
        "0",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
    // The flags that a hand-kept list once left out are refused too, by name
    // (the unit test cli::stream::tests covers every flag of the group).
    for (flag, value) in [("--cache-policy", "lfu"), ("--cache-ceil-mb", "64")] {
        let o = bmoe(&["run", "-p", "x", "--resident", flag, value]);
        assert_eq!(o.status.code(), Some(2), "{flag}: {}", stderr(&o));
        assert!(stderr(&o).contains(flag), "{flag}: {}", stderr(&o));
    }
}

#[test]
fn an_moe_layout_without_stacked_expert_tensors_is_refused_by_name() {
    use bmoe::llama::gguf::{GgufBuilder, GgufFile};
    use std::os::unix::fs::FileExt;
    // SmolLM2 that claims 8 experts but keeps its dense FFN tensors.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("claims-moe.gguf");
    let src = GgufFile::open(smollm2()).unwrap();
    let mut b = GgufBuilder::new(32).unwrap();
    b.copy_metadata_from(&src).unwrap();
    b.set_u32("llama.expert_count", 8).unwrap();
    b.set_u32("llama.expert_used_count", 2).unwrap();
    for t in src.tensors() {
        let n = if t.ne[1] > 1 { 2 } else { 1 };
        b.add_tensor(&t.name, t.ggml_type, &t.ne[..n]).unwrap();
    }
    let file = std::fs::File::open(smollm2()).unwrap();
    b.write(&out, |i, buf| {
        let t = &src.tensors()[i];
        buf.resize(t.size_bytes as usize, 0);
        file.read_exact_at(buf, t.file_offset).unwrap();
        Ok(())
    })
    .unwrap();
    let o = bmoe(&["run", "-m", out.to_str().unwrap(), "-p", "hi", "-n", "2"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("ffn_{gate,up,gate_up,down}_exps") && stderr(&o).contains("seen"),
        "names the missing tensors and what it saw: {}",
        stderr(&o)
    );
}
