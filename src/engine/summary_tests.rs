//! Tests of `summary` (beside it to keep that file on its one topic).
use std::time::Duration;

use bmoe_decode::telemetry::{Cost, Reads};

use super::*;
use crate::engine::config::SpecConfig;
use crate::engine::run_report::{ExpertUse, FlashTotals, MemoryTotals, PrefetchReport, SpecReport};
use crate::generate::Generation;
use crate::layout::MoeLayout;

/// A streamed run of 3 tokens: the prefill, a cold decode, a warm one.
fn streamed() -> RunReport {
    let row = |prefill, wall_ms, misses, hits| TokenRow {
        prefill,
        cost: Cost {
            wall_ms,
            stall_ms: wall_ms / 2.0,
            io_ms: wall_ms / 4.0,
            ..Cost::default()
        },
        reads: Reads {
            misses,
            hits,
            read_bytes: misses * 1024 * 1024,
            ..Reads::default()
        },
        ..TokenRow::default()
    };
    RunReport {
        generation: Generation {
            prompt_tokens: 5,
            tokens: vec![1, 2, 3],
            text: "abc".into(),
            stop: StopReason::Limit,
            prefill: Duration::from_millis(30),
            decode: Duration::from_millis(300),
            spec: SpecStats::default(),
        },
        decode_span: Duration::from_millis(200),
        spec: SpecReport {
            config: SpecConfig {
                draft_max: 0,
                ..SpecConfig::default()
            },
            head_read_bytes: 0,
            verify_read_bytes: 0,
            head: Default::default(),
        },
        rows: vec![
            row(true, 30.0, 8, 0),
            row(false, 100.0, 4, 4),
            row(false, 50.0, 0, 8),
        ],
        mode: Mode::Stream(()),
        notes: vec![crate::engine::note::Note::DenseResident],
        flash: FlashTotals {
            reader: "io_uring".into(),
            read_bytes: 12 << 20,
            kernel_read_bytes: None,
        },
        memory: MemoryTotals {
            cache_budget_bytes: 64 << 20,
            ..MemoryTotals::default()
        },
        prefetch: PrefetchReport::default(),
        warm_lines: Vec::new(),
        experts: ExpertUse {
            used: 2,
            model: 2,
            drop_cold: 0.0,
        },
        layout: MoeLayout {
            arch: "llama".into(),
            n_layer: 2,
            n_expert: 8,
            n_expert_used: 2,
            alignment: 32,
            blocks_in_table: 2,
            ..MoeLayout::default()
        },
        done_line: String::new(),
        startup: crate::engine::startup::Startup::default(),
        prefill: crate::engine::prefill::PrefillReport::default(),
    }
}

#[test]
fn a_streamed_runs_summary_is_computed_from_its_rows() {
    let v = streamed().summary_lines();
    assert!(v[0].starts_with("generation: 5 prompt tokens, 3 generated (token limit)"));
    // 2 tokens after the first over 200 ms; 75 ms per decode row.
    assert!(
        v[0].contains("decode 10.00 tok/s (75.0 ms/token"),
        "{}",
        v[0]
    );
    assert!(v[2].starts_with("moe-stream: io_uring, read 12.0 MiB (2.00 MiB/token decode)"));
    assert!(v[2].contains("flash wait 37.5"), "{}", v[2]);
    assert_eq!(
        v[3],
        "moe-warm: 20.00 tok/s over the 1 decodes that needed no read (after warm-up; 1 tokens)"
    );
    assert!(
        v[4].starts_with("moe-cache: budget 64 MiB, hit 50.0% (12/24), decode hit 75.0% (12/16)"),
        "{}",
        v[4]
    );
    // 75 ms a token, 37.5 of it waiting, the reads' own time 18.75.
    assert!(
        v[5].starts_with(
            "moe-bound: compute 26.67 tok/s (37.5 ms/token), \
             reads 53.33 tok/s (2.00 MiB/token at their own 107 MiB/s)"
        ),
        "{}",
        v[5]
    );
    assert!(
        v[5].ends_with("overlap bound 26.67 tok/s: decode at 0.50 of it"),
        "{}",
        v[5]
    );
    assert!(
        v[6].starts_with("prefill: stopped before its first micro-batch ended"),
        "a prefill of no recorded tokens says it was stopped, not 0 tokens in 0 s: {}",
        v[6]
    );
    assert!(v[7].starts_with("load: 0.00 s"), "{}", v[7]);
    assert_eq!(
        v.last().map(String::as_str),
        Some("note: dense model (no expert tensors): running resident, nothing to stream")
    );
    assert_eq!(v.len(), 9, "no prefetch, drop or speculation lines: {v:?}");
}

#[test]
fn a_resident_run_has_no_moe_lines_and_a_lossy_one_says_so() {
    let mut r = streamed();
    r.mode = Mode::Resident;
    assert!(r.summary_lines().iter().all(|l| !l.starts_with("moe-")));
    r.experts.used = 1;
    let drop = r
        .summary_lines()
        .into_iter()
        .find(|l| l.starts_with("moe-drop"));
    let drop = drop.expect("a moe-drop line");
    assert!(drop.contains("LOSSY, top-k 1 of the model's 2"), "{drop}");
    assert!(drop.contains("of 4 routed experts"), "{drop}");
}
