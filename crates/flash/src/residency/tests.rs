//! The pin/evict interplay: a pinned slot is never retracted under its
//! reader, a slot that is not resident is never answered, checked against a
//! model over random operations and across two threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::Residency;
use crate::cache::SlotKey;

fn key(layer: u32, expert: u32) -> SlotKey {
    SlotKey { layer, expert }
}

#[test]
fn a_slot_is_pinned_only_while_resident() {
    let r = Residency::new(2, 4);
    assert!(!r.pin(key(0, 1)), "nothing is resident yet");
    assert_eq!(r.pins(key(0, 1)), 0, "a failed pin leaves nothing held");
    r.publish(key(0, 1));
    assert!(r.pin(key(0, 1)));
    assert!(!r.pin(key(1, 1)), "another layer's slot is another word");
    assert!(
        !r.pin(key(0, 9)),
        "an expert outside the table is never resident"
    );
    assert!(r.begin_retract(key(0, 1)), "the reader still holds it");
    assert!(!r.pin(key(0, 1)), "no pin after the retraction began");
    r.unpin(key(0, 1));
    assert_eq!(r.pins(key(0, 1)), 0);
    assert!(!r.begin_retract(key(0, 1)));
}

#[test]
fn the_resident_keys_are_the_published_ones_layer_major() {
    let r = Residency::new(3, 4);
    assert!(r.resident_keys().is_empty());
    for k in [key(2, 3), key(0, 1), key(1, 0)] {
        r.publish(k);
    }
    r.publish(key(0, 2));
    r.retract(key(0, 2));
    assert_eq!(r.resident_keys(), [key(0, 1), key(1, 0), key(2, 3)]);
}

#[test]
fn a_retraction_waits_for_the_reader_to_unpin() {
    let r = Arc::new(Residency::new(1, 2));
    let k = key(0, 0);
    r.publish(k);
    assert!(r.pin(k));
    let done = Arc::new(AtomicBool::new(false));
    let evicter = {
        let (r, done) = (r.clone(), done.clone());
        std::thread::spawn(move || {
            r.retract(k);
            done.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(!done.load(Ordering::SeqCst), "evicted under its reader");
    assert!(
        !r.is_resident(k),
        "the slot is already out of the fast path"
    );
    r.unpin(k);
    evicter.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
}

#[test]
fn readers_racing_an_evicter_never_hold_a_retracted_slot() {
    // The evicter retracts and re-publishes one slot in a loop, recording
    // while it is "overwritten"; readers pin and check it is not.
    let r = Arc::new(Residency::new(1, 1));
    let k = key(0, 0);
    let rewriting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let evicter = {
        let (r, rewriting, stop) = (r.clone(), rewriting.clone(), stop.clone());
        std::thread::spawn(move || {
            for _ in 0..20_000 {
                r.retract(k);
                rewriting.store(true, Ordering::SeqCst);
                rewriting.store(false, Ordering::SeqCst);
                r.publish(k);
            }
            stop.store(true, Ordering::SeqCst);
        })
    };
    while !stop.load(Ordering::SeqCst) {
        if r.pin(k) {
            assert!(
                !rewriting.load(Ordering::SeqCst),
                "pinned while overwritten"
            );
            r.unpin(k);
        }
    }
    evicter.join().unwrap();
    assert_eq!(r.pins(k), 0);
}

#[derive(Debug, Clone)]
enum Op {
    Publish(u32),
    Retract(u32),
    Pin(u32),
    Unpin(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..3).prop_map(Op::Publish),
        (0u32..3).prop_map(Op::Retract),
        (0u32..3).prop_map(Op::Pin),
        (0u32..3).prop_map(Op::Unpin),
    ]
}

proptest! {
    /// Against a model (resident flag and pin count per slot): a pin succeeds
    /// exactly when the slot is resident, a retraction reports exactly the
    /// readers left, and a retracted slot is never pinned until published again.
    #[test]
    fn pins_and_retractions_follow_the_model(ops in proptest::collection::vec(op(), 1..200)) {
        let r = Residency::new(1, 3);
        let mut resident = [false; 3];
        let mut pins = [0u32; 3];
        for op in ops {
            match op {
                Op::Publish(e) => {
                    // The actor publishes a slot only once its old readers are gone.
                    if pins[e as usize] == 0 {
                        r.publish(key(0, e));
                        resident[e as usize] = true;
                    }
                }
                Op::Retract(e) => {
                    let left = r.begin_retract(key(0, e));
                    prop_assert_eq!(left, pins[e as usize] > 0);
                    resident[e as usize] = false;
                }
                Op::Pin(e) => {
                    let got = r.pin(key(0, e));
                    prop_assert_eq!(got, resident[e as usize]);
                    if got {
                        pins[e as usize] += 1;
                    }
                }
                Op::Unpin(e) => {
                    if pins[e as usize] > 0 {
                        r.unpin(key(0, e));
                        pins[e as usize] -= 1;
                    }
                }
            }
            for e in 0..3u32 {
                prop_assert_eq!(r.pins(key(0, e)), pins[e as usize]);
                prop_assert_eq!(r.is_resident(key(0, e)), resident[e as usize]);
            }
        }
    }
}
