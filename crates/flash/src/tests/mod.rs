//! The reader and the flash actor against a real file (no model needed),
//! and the helpers the tests share.

mod background;
mod demand;
mod fast;
pub(crate) mod faults;
mod reader;
mod recycle;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::cache::Requester;

/// A file whose byte at offset i is a function of i.
fn pattern_file(len: usize) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new_in(std::env::temp_dir()).unwrap();
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u64).wrapping_mul(2654435761).rotate_right(13) as u8)
        .collect();
    f.write_all(&data).unwrap();
    f.flush().unwrap();
    f
}

/// A model in one file.
fn one_file(path: &std::path::Path) -> [ShardFile; 1] {
    [ShardFile {
        path: path.to_path_buf(),
        base: 0,
    }]
}

fn expect(off: u64, len: u64) -> Vec<u8> {
    (off..off + len)
        .map(|i| i.wrapping_mul(2654435761).rotate_right(13) as u8)
        .collect()
}

/// `layers` x 3 projections x 4 experts of `slice` bytes over a pattern file.
pub(super) fn layered_specs(layers: u32, slice: u64) -> (tempfile::NamedTempFile, Vec<TensorSpec>) {
    let f = pattern_file((layers as u64 * 3 * 4 * slice) as usize);
    let mut specs = Vec::new();
    for layer in 0..layers {
        for proj in crate::proj::Proj::ALL {
            specs.push(TensorSpec {
                layer,
                proj,
                file_offset: ((layer as u64 * 3 + proj.index() as u64) * 4) * slice,
                slice_bytes: slice,
                n_expert: 4,
            });
        }
    }
    (f, specs)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A flash actor over three layers of four `slice`-byte experts, zero budget.
fn small_flash(slice: u64) -> (tempfile::NamedTempFile, Flash) {
    let (f, specs) = layered_specs(3, slice);
    let flash = Flash::spawn(
        &one_file(f.path()),
        specs,
        FlashConfig {
            budget_bytes: 0,
            request_capacity: 8,
            ..FlashConfig::default()
        },
    )
    .unwrap();
    (f, flash)
}
