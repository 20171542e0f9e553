use super::*;

/// A model of 3 layers (layer 0 dense), 8 experts, k 2.
fn header() -> TraceHeader {
    TraceHeader {
        n_expert: 8,
        k: 2,
        trunk_layers: 3,
        slot_bytes: vec![0, 100, 100],
        model_bytes: 1000,
        model_name: "m.gguf".into(),
    }
}

fn demand(layer: u32, ids: &[u16]) -> TraceRecord {
    TraceRecord::Demand {
        layer,
        ids: ids.to_vec(),
    }
}

fn end(rows: u32, outputs: u32) -> TraceRecord {
    TraceRecord::DecodeEnd { rows, outputs }
}

/// A 3-token prompt (its last layer keeps the last row), then two decodes.
fn records() -> Vec<TraceRecord> {
    vec![
        demand(1, &[0, 1, 2, 3, 4, 5]),
        demand(2, &[6, 7]),
        end(3, 1),
        demand(1, &[1, 2]),
        demand(2, &[3, 4]),
        end(1, 1),
        demand(1, &[5, 6]),
        demand(2, &[7, 0]),
        end(1, 1),
    ]
}

fn rows(c: &RouteCursor, layer: u32, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    c.fill(layer, n, &mut out).expect("routed");
    out
}

#[test]
fn tokens_take_their_own_rows_and_a_cut_row_the_next_tokens() {
    let r = ForcedRoutes::from_records(&header(), &records()).expect("a table");
    assert_eq!(r.tokens(), 5);
    assert_eq!(r.row(0, 1), Some(&[0, 1][..]));
    assert_eq!(r.row(2, 1), Some(&[4, 5][..]));
    // The prompt's last layer held its last row only: rows 0 and 1 take it.
    assert_eq!(r.row(2, 2), Some(&[6, 7][..]));
    assert_eq!(r.row(0, 2), Some(&[6, 7][..]));
    assert_eq!(r.row(4, 2), Some(&[7, 0][..]));
    // Wrapping: token 5 is token 0.
    assert_eq!(r.row(5, 1), r.row(0, 1));
    assert_eq!(r.row(0, 0), None, "the dense layer is not routed");
}

#[test]
fn a_cut_row_after_the_last_filled_one_wraps_to_the_first() {
    // A trace ending in a prompt: its first rows at layer 2 take token 1's.
    let recs = vec![
        demand(1, &[0, 1]),
        demand(2, &[2, 3]),
        end(1, 1),
        demand(1, &[4, 5, 6, 7]),
        demand(2, &[1, 2]),
        end(2, 1),
    ];
    let r = ForcedRoutes::from_records(&header(), &recs).unwrap();
    assert_eq!(r.tokens(), 3);
    assert_eq!(r.row(1, 2), Some(&[1, 2][..]), "the last row of the prompt");
    assert_eq!(r.row(2, 2), Some(&[1, 2][..]));
    let recs = vec![demand(1, &[0, 1, 2, 3]), demand(2, &[4, 5]), end(2, 1)];
    let r = ForcedRoutes::from_records(&header(), &recs).unwrap();
    assert_eq!(r.row(0, 2), Some(&[4, 5][..]));
}

#[test]
fn batches_without_decode_ends_are_told_apart_by_the_layer_order() {
    let recs = vec![
        demand(1, &[0, 1]),
        demand(2, &[2, 3]),
        demand(1, &[4, 5]),
        demand(2, &[6, 7]),
    ];
    let r = ForcedRoutes::from_records(&header(), &recs).unwrap();
    assert_eq!(r.tokens(), 2);
    assert_eq!(r.row(1, 2), Some(&[6, 7][..]));
    let none = [
        end(1, 1),
        TraceRecord::Weights {
            layer: 1,
            weights: vec![0.5, 0.5],
        },
    ];
    assert!(ForcedRoutes::from_records(&header(), &none).is_none());
}

#[test]
fn the_cursor_walks_prompt_rows_then_decodes_and_wraps() {
    let r = Arc::new(ForcedRoutes::from_records(&header(), &records()).unwrap());
    let mut c = RouteCursor::new(r);
    // A 2-token prompt: layer 1 both rows, layer 2 the last one.
    c.decode_begin(2);
    assert_eq!(rows(&c, 1, 2), [0, 1, 2, 3]);
    assert_eq!(rows(&c, 2, 1), [6, 7], "token 1 takes token 2's cut row");
    c.decode_end();
    for (layer1, layer2) in [([4, 5], [6, 7]), ([1, 2], [3, 4]), ([5, 6], [7, 0])] {
        c.decode_begin(1);
        assert_eq!(rows(&c, 1, 1), layer1);
        assert_eq!(rows(&c, 2, 1), layer2);
        c.decode_end();
    }
    // Past the trace's 5 tokens: token 0 again.
    c.decode_begin(1);
    assert_eq!(rows(&c, 1, 1), [0, 1]);
    let mut out = Vec::new();
    assert_eq!(c.fill(0, 1, &mut out), Err(0), "layer 0 is never routed");
}

#[test]
fn another_shape_is_named_and_another_slot_size_is_not_one() {
    let h = header();
    assert_eq!(shape_differs(&h, &h), None);
    let q8 = TraceHeader {
        slot_bytes: vec![0, 50, 50],
        ..header()
    };
    assert_eq!(shape_differs(&h, &q8), None, "another quantization");
    for other in [
        TraceHeader { k: 4, ..header() },
        TraceHeader {
            n_expert: 16,
            ..header()
        },
        TraceHeader {
            slot_bytes: vec![100, 100, 100],
            ..header()
        },
        TraceHeader {
            trunk_layers: 4,
            slot_bytes: vec![0, 100, 100, 100],
            ..header()
        },
    ] {
        let why = shape_differs(&other, &h).expect("another shape");
        assert!(
            why.contains("this run 2 MoE layers of 3, 8 experts, k 2"),
            "{why}"
        );
    }
}

#[test]
fn load_refuses_a_file_that_is_not_a_trace_of_this_shape() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, h: &TraceHeader, recs: &[TraceRecord]| {
        let p = dir.path().join(name);
        let mut w = bmoe_trace::route_trace::TraceWriter::new(Vec::new(), h.clone()).unwrap();
        for r in recs {
            w.record(r).unwrap();
        }
        std::fs::write(&p, w.into_inner()).unwrap();
        p
    };
    let m = Path::new("m.gguf");
    let good = write("good", &header(), &records());
    assert_eq!(load(&good, m, &header()).unwrap().tokens(), 5);
    let other = TraceHeader { k: 4, ..header() };
    let e = load(&good, m, &other).unwrap_err().to_string();
    assert!(
        e.contains("another shape") && e.contains("bmoe trace import --like m.gguf"),
        "{e}"
    );
    let empty = write("empty", &header(), &[]);
    let e = load(&empty, m, &header()).unwrap_err().to_string();
    assert!(e.contains("holds no routing"), "{e}");
    let half = write("half", &header(), &[demand(1, &[0, 1]), end(1, 1)]);
    let e = load(&half, m, &header()).unwrap_err().to_string();
    assert!(e.contains("at layer 2"), "{e}");
    let e = load(dir.path(), m, &header()).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    let e = load(&dir.path().join("none"), m, &header())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("--route-from "), "{e}");
    // Cut mid-record: what is whole forces.
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.path().join("cut");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    assert_eq!(load(&cut, m, &header()).unwrap().tokens(), 5);
}

#[test]
fn a_forced_runs_own_trace_is_its_prompt_batch_then_its_tokens() {
    let r = ForcedRoutes::from_records(&header(), &records()).unwrap();
    let run = RunShape {
        prompt_tokens: 2,
        generated_tokens: 5,
    };
    let recs = r.run_records(&[1, 2], run);
    // The 2-token prompt: both rows at layer 1, the last at layer 2.
    assert_eq!(
        recs[..3],
        [demand(1, &[0, 1, 2, 3]), demand(2, &[6, 7]), end(2, 1)]
    );
    // 5 generated: the prompt's gives the first, then decodes of tokens 2, 3,
    // 4 and 5, which wraps to token 0.
    assert_eq!(
        recs[3..6],
        [demand(1, &[4, 5]), demand(2, &[6, 7]), end(1, 1)]
    );
    assert_eq!(
        recs[12..],
        [demand(1, &[0, 1]), demand(2, &[6, 7]), end(1, 1)]
    );
    let no_prompt = RunShape {
        prompt_tokens: 0,
        generated_tokens: 2,
    };
    assert_eq!(
        r.run_records(&[1, 2], no_prompt)[..2],
        [demand(1, &[0, 1]), demand(2, &[6, 7])]
    );
    // What a cursor hands the same run, decode by decode.
    let mut c = RouteCursor::new(Arc::new(r));
    c.decode_begin(2);
    assert_eq!(rows(&c, 1, 2), [0, 1, 2, 3]);
    c.decode_end();
    for chunk in recs[3..].chunks(3) {
        c.decode_begin(1);
        assert_eq!(chunk[0], demand(1, &rows(&c, 1, 1)));
        assert_eq!(chunk[1], demand(2, &rows(&c, 2, 1)));
        c.decode_end();
    }
}
