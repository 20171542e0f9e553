//! Which expert slots are resident, shared lock-free between the flash actor
//! and the hooks, so a demand whose experts are all resident is answered on
//! the hook's own thread without a round trip to the actor.
//!
//! A slot's address in the arena is a function of its key (expert e of layer
//! L is always at the same place), so one atomic word per (layer, expert)
//! says everything: its top bit is "resident" (every byte read), the rest
//! counts the readers that pinned it. The protocol:
//! - the actor sets the bit once a slot's reads completed ([`publish`]);
//! - a reader adds a pin, and keeps it only when the word it replaced had the
//!   bit set ([`pin`]); otherwise it takes the pin back and asks the actor;
//! - the actor, before a slot's pages are released, moved or overwritten,
//!   clears the bit and then waits until the pins are gone ([`retract`]).
//!
//! Both sides change the same word with read-modify-write operations, so the
//! order between a pin and a retraction is total: a pin taken after the bit
//! was cleared fails, and one taken before is waited for. A pinned slot is
//! therefore never evicted under its reader, and a slot re-used for another
//! key is never answered: another key is another word.
//!
//! [`publish`]: Residency::publish
//! [`pin`]: Residency::pin
//! [`retract`]: Residency::retract

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::cache::SlotKey;

/// The "every byte read" bit of a slot's word.
const RESIDENT: u32 = 1 << 31;
/// The pin count of a slot's word.
const PINS: u32 = RESIDENT - 1;
/// How long [`Residency::retract`] waits for readers before it warns (it
/// keeps waiting: releasing memory a matmul reads would be silent garbage).
const SLOW_RETRACT: Duration = Duration::from_secs(5);

/// One word per (layer, expert), layer-major.
#[derive(Debug)]
pub struct Residency {
    words: Vec<AtomicU32>,
    stride: usize,
}

impl Residency {
    /// No slot resident, none pinned.
    pub fn new(n_layer: usize, n_expert: usize) -> Self {
        Self {
            words: (0..n_layer * n_expert).map(|_| AtomicU32::new(0)).collect(),
            stride: n_expert,
        }
    }

    fn word(&self, k: SlotKey) -> Option<&AtomicU32> {
        if k.expert as usize >= self.stride {
            return None;
        }
        self.words
            .get(k.layer as usize * self.stride + k.expert as usize)
    }

    /// Whether `k`'s bytes are all read (a hint: only a pin makes it last).
    pub fn is_resident(&self, k: SlotKey) -> bool {
        self.word(k)
            .is_some_and(|w| w.load(Ordering::Acquire) & RESIDENT != 0)
    }

    /// Every slot resident now, layer-major (a snapshot: the actor may
    /// change any of them at once).
    pub fn resident_keys(&self) -> Vec<SlotKey> {
        let stride = self.stride.max(1);
        self.words
            .iter()
            .enumerate()
            .filter(|(_, w)| w.load(Ordering::Acquire) & RESIDENT != 0)
            .map(|(i, _)| SlotKey {
                layer: (i / stride) as u32,
                expert: (i % stride) as u32,
            })
            .collect()
    }

    /// Readers holding `k` now.
    pub fn pins(&self, k: SlotKey) -> u32 {
        self.word(k).map_or(0, |w| w.load(Ordering::Acquire) & PINS)
    }

    /// Reader: pin `k` if it is resident (true: it stays resident and its
    /// bytes unchanged until [`unpin`](Self::unpin)); false, nothing held.
    pub fn pin(&self, k: SlotKey) -> bool {
        let Some(w) = self.word(k) else {
            return false;
        };
        let old = w.fetch_add(1, Ordering::AcqRel);
        debug_assert!(old & PINS < PINS, "pin count overflow on {k:?}");
        if old & RESIDENT != 0 {
            return true;
        }
        w.fetch_sub(1, Ordering::Release);
        false
    }

    /// Reader: drop a pin taken by a successful [`pin`](Self::pin).
    pub fn unpin(&self, k: SlotKey) {
        if let Some(w) = self.word(k) {
            let old = w.fetch_sub(1, Ordering::Release);
            debug_assert!(old & PINS > 0, "unpin of {k:?} without a pin");
        }
    }

    /// Actor: every byte of `k` is read (Release: a reader that pins it sees them).
    pub(crate) fn publish(&self, k: SlotKey) {
        if let Some(w) = self.word(k) {
            w.fetch_or(RESIDENT, Ordering::Release);
        }
    }

    /// Actor: `k` stops being resident; returns whether readers still hold it
    /// (they pinned it before; no new pin succeeds from now on).
    pub(crate) fn begin_retract(&self, k: SlotKey) -> bool {
        self.word(k)
            .is_some_and(|w| w.fetch_and(!RESIDENT, Ordering::AcqRel) & PINS != 0)
    }

    /// Actor: `k` stops being resident, and once this returns no reader reads
    /// it (its pages may be released, moved or overwritten). Readers hold a
    /// pin for one layer's matmuls and never wait on the actor while they
    /// hold one, so the wait is short.
    pub(crate) fn retract(&self, k: SlotKey) {
        if !self.begin_retract(k) {
            return;
        }
        let t0 = Instant::now();
        let mut warned = false;
        let mut spins = 0u32;
        while self.pins(k) > 0 {
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
            if !warned && t0.elapsed() > SLOW_RETRACT {
                warned = true;
                tracing::warn!("expert slot {k:?} still pinned by a reader after {SLOW_RETRACT:?}");
            }
        }
    }

    /// Actor: [`retract`](Self::retract) each of `keys`.
    pub(crate) fn retract_all(&self, keys: &[SlotKey]) {
        for &k in keys {
            self.retract(k);
        }
    }
}

#[cfg(test)]
mod tests;
