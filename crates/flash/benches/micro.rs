//! Micro-benchmarks of the pure policy and the I/O path, no model needed:
//! the expert cache's request/evict, one channel hop between two threads,
//! and expert-slice reads at several queue depths (the n-gram matcher's is
//! bmoe-decode's `ngram` bench).
//!
//! `cargo bench -p bmoe-flash --bench micro` runs them; CI only builds them.

use std::alloc::Layout;
use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use bmoe_flash::cache::{ExpertCache, Requester, SlotKey};
use bmoe_flash::{open_reader, ReadOp};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// A deterministic xorshift stream.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// One token's routing, layer after layer: `k` uniformly drawn experts of
/// the next layer (repeats allowed) each call.
struct Routing {
    rng: Rng,
    layer: u32,
    layers: u32,
    experts: u32,
    k: usize,
}

impl Routing {
    fn next_layer(&mut self) -> Vec<SlotKey> {
        let layer = self.layer;
        self.layer = (self.layer + 1) % self.layers;
        (0..self.k)
            .map(|_| SlotKey {
                layer,
                expert: (self.rng.next() % u64::from(self.experts)) as u32,
            })
            .collect()
    }
}

fn cache(c: &mut Criterion) {
    // E64K4's shape: 30 layers x 64 experts, top-4, 1.58 MiB per slot; a
    // budget of 25% of the slots.
    let layers = 30u32;
    let experts = 64u32;
    let slot = 3 * 552_960u64;
    let budget = slot * (layers * experts) as u64 / 4;
    let mut cache = ExpertCache::new(budget, vec![slot; layers as usize]);
    let mut routing = Routing {
        rng: Rng(0x51ed),
        layer: 0,
        layers,
        experts,
        k: 4,
    };
    c.bench_function("cache_request_layer_top4", |b| {
        b.iter(|| black_box(cache.request(Requester::Verify, &routing.next_layer())))
    });
}

/// Qwen3-30B-A3B's expert grid (48 layers x 128 experts, top-8, Q8_0 slots
/// of 4.78 MiB) at half its experts, the `cycle` and `learned` policies: every
/// request of a full cache ranks the ~3,000 resident slots to pick its victims
/// (`learned` also updates its model over the layer's 128 slots).
fn cache_big_cycle(c: &mut Criterion) {
    for policy in [
        bmoe_flash::cache::CachePolicy::Cycle,
        bmoe_flash::cache::CachePolicy::Learned,
    ] {
        cache_big(c, policy);
    }
}

fn cache_big(c: &mut Criterion, policy: bmoe_flash::cache::CachePolicy) {
    let (layers, experts) = (48u32, 128u32);
    let slot = 3 * 1_671_168u64;
    let budget = slot * (layers * experts) as u64 / 2;
    let mut cache = ExpertCache::with_policy(budget, vec![slot; layers as usize], policy);
    let mut routing = Routing {
        rng: Rng(0x9e37),
        layer: 0,
        layers,
        experts,
        k: 8,
    };
    let mut request =
        |cache: &mut ExpertCache| cache.request(Requester::Verify, &routing.next_layer());
    // Fill it first: the measured requests each evict.
    while cache.resident_bytes() + 8 * slot <= budget {
        request(&mut cache);
    }
    c.bench_function(&format!("cache_request_qwen3_q8_half_{policy}"), |b| {
        b.iter(|| black_box(request(&mut cache)))
    });
}

fn channel_hop(c: &mut Criterion) {
    let (req_tx, req_rx) = crossbeam_channel::bounded::<u64>(1);
    let (rep_tx, rep_rx) = crossbeam_channel::bounded::<u64>(1);
    let echo = std::thread::spawn(move || {
        while let Ok(v) = req_rx.recv() {
            if rep_tx.send(v + 1).is_err() {
                break;
            }
        }
    });
    c.bench_function("channel_round_trip", |b| {
        b.iter(|| {
            req_tx.send(black_box(1)).expect("echo thread alive");
            rep_rx.recv().expect("echo thread alive")
        })
    });
    drop(req_tx);
    let _ = echo.join();
}

struct Aligned(*mut u8, Layout);
impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `slice_reads` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.0, self.1) }
    }
}

fn slice_reads(c: &mut Criterion) {
    // A 64 MiB file of E64K4-sized slices (552960 bytes, page-aligned).
    let slice = 552_960u64;
    let n_slices = 120u64;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join("bmoe-micro-slices.bin");
    if std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) != slice * n_slices {
        let mut f = std::fs::File::create(&path).expect("create the bench file");
        let chunk = vec![0x5au8; slice as usize];
        for _ in 0..n_slices {
            f.write_all(&chunk).expect("write the bench file");
        }
        f.sync_all().expect("sync the bench file");
    }
    let mut g = c.benchmark_group("slice_read_o_direct");
    g.measurement_time(Duration::from_secs(3));
    let mut rng = Rng(0xd15c);
    for &depth in &[1u32, 4, 16] {
        let (mut reader, notes) = open_reader(&path, true, depth, slice).expect("open reader");
        for n in notes {
            eprintln!("note: {n}");
        }
        let layout = Layout::from_size_align(slice as usize, 4096).expect("layout");
        let bufs: Vec<Aligned> = (0..depth)
            .map(|_| {
                // SAFETY: non-zero size layout; freed by Aligned's Drop.
                let p = unsafe { std::alloc::alloc(layout) };
                assert!(!p.is_null(), "allocation failed");
                Aligned(p, layout)
            })
            .collect();
        g.throughput(Throughput::Bytes(slice * depth as u64));
        g.bench_function(BenchmarkId::from_parameter(depth), |b| {
            b.iter(|| {
                let ops: Vec<ReadOp> = bufs
                    .iter()
                    .map(|buf| ReadOp {
                        dst: buf.0,
                        file_offset: (rng.next() % n_slices) * slice,
                        len: slice,
                    })
                    .collect();
                // SAFETY: each op writes its own buffer of `slice` bytes, used by nobody else.
                unsafe { reader.read_all(&ops) }.expect("read")
            })
        });
    }
    g.finish();
}

criterion_group!(benches, cache, cache_big_cycle, channel_hop, slice_reads);
criterion_main!(benches);
