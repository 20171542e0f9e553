//! The prompt's pass when streaming: with `--ubatch auto` the prompt runs as
//! one micro-batch, so at `--cache-mb 0` each routed expert is read about once
//! (the next layer read whole ahead of its routing); in small micro-batches
//! every micro-batch reads the layers again. The text stays the resident one.

use bmoe::engine::{Mode, RunReport, Ubatch};
use bmoe::stream::{CacheSize, StreamConfig};

use crate::common::{e8k2_cli, e8k2_config, stderr};

/// The copy workload: ~480 tokens, so E8K2 (8 experts, 2 per token) routes to
/// every expert of every layer in any micro-batch of 64 tokens or more.
const PROMPT: &str = include_str!("../../benches/workloads/copy.txt");

fn run(mode: Mode, ubatch: Ubatch) -> RunReport {
    let mut cfg = e8k2_config(mode, 4);
    cfg.job.prompt = PROMPT.into();
    cfg.ubatch = ubatch;
    bmoe::engine::run(&cfg, |_| {}).expect("run")
}

fn streamed(cache: CacheSize) -> Mode {
    Mode::Stream(StreamConfig {
        cache,
        ..StreamConfig::default()
    })
}

#[test]
fn one_micro_batch_reads_each_routed_expert_about_once() {
    let resident = run(Mode::Resident, Ubatch::Auto);
    let whole = run(streamed(CacheSize::Mib(0)), Ubatch::Auto);
    let small = run(streamed(CacheSize::Mib(0)), Ubatch::Fixed(64));
    let p = &whole.prefill;
    assert!(p.tokens > 200, "{p:?}");
    assert_eq!((p.micro_batches(), p.facts.ubatch), (1, 512), "{p:?}");
    let all_experts = whole.layout.expert_bytes();
    assert!(
        p.distinct_bytes > 0 && p.distinct_bytes <= all_experts,
        "{p:?}"
    );
    let multiple = p.read_multiple().expect("streamed reads");
    assert!(
        (1.0..=1.1).contains(&multiple),
        "auto: {multiple:.3}x ({p:?})"
    );
    assert!(p.readahead_bytes > 0, "the next layer is read ahead: {p:?}");
    let s = &small.prefill;
    assert!(s.micro_batches() >= 4, "{s:?}");
    let small_multiple = s.read_multiple().expect("streamed reads");
    assert!(
        small_multiple > 3.0,
        "64-token micro-batches re-read: {small_multiple:.2}x"
    );
    assert_eq!(whole.generation.text, resident.generation.text);
    assert_eq!(small.generation.text, resident.generation.text);
    assert_eq!(resident.prefill.micro_batches(), 1);
    assert_eq!(resident.prefill.read_multiple(), None);
}

#[test]
fn the_prefill_is_reported_in_the_summary_and_bmoe_done() {
    let o = e8k2_cli(PROMPT, 2, &["--cache-mb", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let line = err
        .lines()
        .find(|l| l.starts_with("prefill: "))
        .unwrap_or_else(|| panic!("no prefill line in\n{err}"));
    assert!(line.contains("in 1 micro-batch of 512"), "{line}");
    assert!(line.contains("MiB of distinct routed slices"), "{line}");
    let done = err.lines().find(|l| l.starts_with("BMOE_DONE ")).unwrap();
    for key in [
        "\"prefill_s\":",
        "\"prefill_tok_s\":",
        "\"prefill_read_bytes\":",
        "\"prefill_distinct_bytes\":",
        "\"prefill_read_multiple\":",
    ] {
        assert!(done.contains(key), "{key} in {done}");
    }
    let bad = e8k2_cli("hi", 1, &["--ubatch", "8"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("16..=8192"), "{}", stderr(&bad));
}
