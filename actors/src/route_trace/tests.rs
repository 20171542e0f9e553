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
