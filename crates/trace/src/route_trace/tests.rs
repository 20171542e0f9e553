//! The trace format: round trips, cuts, and what is refused.
use super::*;

fn header() -> TraceHeader {
    TraceHeader {
        n_expert: 8,
        k: 2,
        trunk_layers: 3,
        slot_bytes: vec![0, 100, 100],
        model_bytes: 12345,
        model_name: "tiny.gguf".into(),
    }
}

fn sample() -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), header()).unwrap();
    w.demand(1, [3, 5, 5, 7].into_iter()).unwrap();
    w.demand(2, [0, 1, 2, 3].into_iter()).unwrap();
    w.decode_end(2, 1).unwrap();
    w.demand(1, [7, 6].into_iter()).unwrap();
    w.decode_end(1, 1).unwrap();
    w.into_inner()
}

#[test]
fn records_round_trip() {
    let (h, recs) = TraceReader::new(&sample()[..]).unwrap().records().unwrap();
    assert_eq!(h, header());
    assert_eq!(h.expert_bytes(), 1600);
    assert_eq!(recs.len(), 5);
    assert_eq!(
        recs[0],
        TraceRecord::Demand {
            layer: 1,
            ids: vec![3, 5, 5, 7]
        }
    );
    assert_eq!(
        recs[4],
        TraceRecord::DecodeEnd {
            rows: 1,
            outputs: 1
        }
    );
}

#[test]
fn a_cut_file_is_truncated_not_garbage() {
    let full = sample();
    for cut in [3, 20, full.len() - 1, full.len() - 3, full.len() - 10] {
        let res = TraceReader::new(&full[..cut]).and_then(|r| r.records());
        assert!(
            matches!(res, Err(TraceError::Truncated { .. })),
            "cut at {cut}: {res:?}"
        );
    }
}

#[test]
fn bad_magic_tags_and_ids_are_refused() {
    assert!(matches!(
        TraceReader::new(&b"GGUF\0\0\0\0\0\0\0\0"[..]),
        Err(TraceError::BadMagic)
    ));
    let mut bad_tag = sample();
    bad_tag.push(9);
    let res = TraceReader::new(&bad_tag[..]).unwrap().records();
    assert!(
        matches!(res, Err(TraceError::Corrupt { index: 5, .. })),
        "{res:?}"
    );
    let mut w = TraceWriter::new(Vec::new(), header()).unwrap();
    w.demand(1, [3].into_iter()).unwrap();
    let odd = w.into_inner();
    let res = TraceReader::new(&odd[..]).unwrap().records();
    assert!(
        matches!(res, Err(TraceError::Corrupt { index: 0, .. })),
        "{res:?}"
    );
    let too_many = TraceHeader {
        n_expert: MAX_EXPERTS + 1,
        ..header()
    };
    assert!(TraceWriter::new(Vec::new(), too_many).is_err());
}

#[test]
fn weights_follow_their_demand_and_round_trip() {
    let mut w = TraceWriter::new(Vec::new(), header()).unwrap();
    let recs = vec![
        TraceRecord::Demand {
            layer: 1,
            ids: vec![3, 5],
        },
        TraceRecord::Weights {
            layer: 1,
            weights: vec![0.75, 0.25],
        },
        TraceRecord::DecodeEnd {
            rows: 1,
            outputs: 1,
        },
    ];
    for r in &recs {
        w.record(r).unwrap();
    }
    let bytes = w.into_inner();
    let (_, back) = TraceReader::new(&bytes[..]).unwrap().records().unwrap();
    assert_eq!(back, recs);
    let cut = TraceReader::new(&bytes[..bytes.len() - 12]).and_then(|r| r.records());
    assert!(matches!(cut, Err(TraceError::Truncated { .. })), "{cut:?}");

    let mut w = TraceWriter::new(Vec::new(), header()).unwrap();
    w.decode_end(1, 1).unwrap();
    w.weights(1, &[1.0]).unwrap();
    let orphan = w.into_inner();
    let res = TraceReader::new(&orphan[..]).unwrap().records();
    assert!(
        matches!(res, Err(TraceError::Corrupt { index: 1, .. })),
        "{res:?}"
    );
    let mut w = TraceWriter::new(Vec::new(), header()).unwrap();
    w.demand(1, [3, 5].into_iter()).unwrap();
    w.weights(1, &[1.0]).unwrap();
    let short = w.into_inner();
    let res = TraceReader::new(&short[..]).unwrap().records();
    assert!(
        matches!(res, Err(TraceError::Corrupt { index: 1, .. })),
        "{res:?}"
    );
}

#[test]
fn headers_whose_sizes_overflow_or_pass_the_format_are_refused() {
    let huge = TraceHeader {
        slot_bytes: vec![0, u64::MAX, u64::MAX],
        ..header()
    };
    let e = TraceWriter::new(Vec::new(), huge.clone()).err().unwrap();
    assert!(e.to_string().contains("not a real model's"), "{e}");
    assert_eq!(huge.expert_bytes(), u64::MAX, "saturates, never panics");
    // A file whose slot size was patched to u64::MAX: refused on reading.
    let mut bytes = sample();
    bytes[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = TraceReader::new(&bytes[..]).err().unwrap();
    assert!(matches!(e, TraceError::Header(_)), "{e}");
    // Just within the bound is a trace; one byte per expert more is not.
    let per_slot = MAX_EXPERT_BYTES / 8 / 2;
    let edge = TraceHeader {
        slot_bytes: vec![0, per_slot, per_slot],
        ..header()
    };
    assert!(edge.check().is_ok());
    let over = TraceHeader {
        slot_bytes: vec![0, per_slot, per_slot + 1],
        ..header()
    };
    assert!(over.check().is_err());
    let layers = TraceHeader {
        slot_bytes: vec![1; MAX_LAYERS as usize + 1],
        ..header()
    };
    assert!(layers.check().unwrap_err().to_string().contains("layers"));
    let slots = TraceHeader {
        n_expert: MAX_EXPERTS,
        slot_bytes: vec![1; (MAX_SLOTS / u64::from(MAX_EXPERTS)) as usize + 1],
        ..header()
    };
    let e = slots.check().unwrap_err().to_string();
    assert!(e.contains("expert slots"), "{e}");
}

#[test]
fn another_models_trace_is_told_apart_but_not_for_its_k() {
    let model = header();
    assert_eq!(header().differs_from(&model), None);
    let other_k = TraceHeader { k: 4, ..header() };
    assert_eq!(other_k.differs_from(&model), None);
    let two_layers = TraceHeader {
        slot_bytes: vec![100, 100],
        trunk_layers: 2,
        model_name: "other.gguf".into(),
        ..header()
    };
    let why = two_layers.differs_from(&model).unwrap();
    assert!(
        why.contains("2 MoE layers of 2") && why.contains("2 MoE layers of 3"),
        "{why}"
    );
    let sizes = TraceHeader {
        slot_bytes: vec![0, 100, 200],
        ..header()
    };
    let why = sizes.differs_from(&model).unwrap();
    assert!(why.contains("layer 2's experts are 200 bytes"), "{why}");
    let experts = TraceHeader {
        n_expert: 16,
        ..header()
    };
    assert!(experts.differs_from(&model).is_some());
}
