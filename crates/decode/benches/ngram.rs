//! Micro-benchmark of the n-gram matcher (`--ngram`'s drafts), no model
//! needed: `cargo bench -p bmoe-decode --bench ngram`; CI only builds it.

use std::hint::black_box;

use bmoe_decode::ngram::{draft, NgramConfig};
use bmoe_flash::xorshift::XorShift;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn ngram(c: &mut Criterion) {
    let mut g = c.benchmark_group("ngram_draft");
    let mut rng = XorShift::new(0x9e37);
    for &len in &[256usize, 2048] {
        // Copy-heavy: a 120-token "function" repeated with a random comment
        // between copies, so the suffix has long earlier matches.
        let body: Vec<u32> = (0..120).map(|_| (rng.next_u64() % 49_152) as u32).collect();
        let mut corpus = Vec::with_capacity(len);
        while corpus.len() < len {
            corpus.extend((0..8).map(|_| (rng.next_u64() % 49_152) as u32));
            corpus.extend(&body);
        }
        corpus.truncate(len);
        let cfg = NgramConfig {
            max_draft: 3,
            ..NgramConfig::default()
        };
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("copy_heavy", len), &corpus, |b, c| {
            b.iter(|| draft(black_box(c), &cfg))
        });
    }
    g.finish();
}

criterion_group!(benches, ngram);
criterion_main!(benches);
