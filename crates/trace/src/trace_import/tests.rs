//! Each format, its spellings, its faults, and a round trip through the
//! trace writer and reader.

use super::*;
use crate::route_trace::{TraceHeader, TraceReader, TraceRecord, TraceWriter, MAX_EXPERTS};

fn flat(n_expert: Option<u32>) -> Sizes {
    Sizes::Flat {
        slot_bytes: 1000,
        n_expert,
        name: "log".into(),
    }
}

fn ok(input: &str, format: ImportFormat) -> Imported {
    import(input.as_bytes(), format, flat(None)).unwrap_or_else(|e| panic!("{e}"))
}

fn err(input: &[u8], format: ImportFormat, sizes: Sizes) -> (Loc, String) {
    match import(input, format, sizes) {
        Ok(i) => panic!("imported {:?}", i.summary),
        Err(ImportError::Bad { at, what }) => (at, what),
    }
}

fn demand(layer: u32, ids: &[u16]) -> TraceRecord {
    TraceRecord::Demand {
        layer,
        ids: ids.to_vec(),
    }
}

const END: TraceRecord = TraceRecord::DecodeEnd {
    rows: 1,
    outputs: 1,
};

/// The demands of each token, in order.
fn demands(records: &[TraceRecord]) -> Vec<Vec<(u32, Vec<u16>)>> {
    let mut out = vec![Vec::new()];
    for r in records {
        match r {
            TraceRecord::Demand { layer, ids } => {
                out.last_mut().unwrap().push((*layer, ids.clone()))
            }
            TraceRecord::DecodeEnd { .. } => out.push(Vec::new()),
            TraceRecord::Weights { .. } => {}
        }
    }
    out.pop();
    out
}

const PER_ROUTE: &str = r#"{"token_idx": 0, "layer": 0, "experts": [3, 1], "weights": [0.7, 0.3]}
{"token_idx": 0, "layer": 1, "experts": [2, 0], "weights": [0.6, 0.4]}
{"token_idx": 1, "layer": 1, "experts": [5, 2], "weights": [0.5, 0.5]}
{"token_idx": 1, "layer": 0, "experts": [1, 3], "weights": [0.9, 0.1]}
"#;

#[test]
fn jsonl_per_route_keeps_weights_and_sorts_layers() {
    let i = ok(PER_ROUTE, ImportFormat::Auto);
    assert_eq!(i.summary.format, ImportFormat::Jsonl);
    assert_eq!((i.summary.tokens, i.summary.layers, i.summary.k), (2, 2, 2));
    assert_eq!(i.summary.n_expert, 6);
    assert!(i.summary.weights);
    let s = &i.summary.spelling;
    assert!(
        s.contains("`experts`") && s.contains("`token_idx`") && s.contains("`weights`"),
        "{s}"
    );
    assert_eq!(
        i.records[..5],
        [
            demand(0, &[3, 1]),
            TraceRecord::Weights {
                layer: 0,
                weights: vec![0.7, 0.3]
            },
            demand(1, &[2, 0]),
            TraceRecord::Weights {
                layer: 1,
                weights: vec![0.6, 0.4]
            },
            END
        ]
    );
    assert_eq!(demands(&i.records)[1], [(0, vec![1, 3]), (1, vec![5, 2])]);
    assert_eq!(i.header.slot_bytes, [1000, 1000]);
    assert_eq!((i.header.k, i.header.n_expert), (2, 6));
}

#[test]
fn jsonl_other_spellings_and_shapes() {
    // One token per line, a list per layer, no token field.
    let per_token = concat!(
        "{\"topk_ids\": [[1, 2], [3, 4]], \"probs\": [[0.5, 0.5], [0.2, 0.8]]}\n",
        "{\"topk_ids\": [[2, 1], [4, 0]], \"probs\": [[0.5, 0.5], [0.2, 0.8]]}"
    );
    let i = ok(per_token, ImportFormat::Jsonl);
    assert_eq!((i.summary.tokens, i.summary.layers), (2, 2));
    assert!(
        i.summary.spelling.contains("`topk_ids`"),
        "{}",
        i.summary.spelling
    );
    assert!(i.summary.spelling.contains("`probs`"));
    // One route per line without a token field: a new token when the layer does not go up.
    let no_token = concat!(
        "{\"layer_idx\": 0, \"selected_experts\": [1]}\n",
        "{\"layer_idx\": 1, \"selected_experts\": [2]}\n",
        "{\"layer_idx\": 0, \"selected_experts\": [3]}\n"
    );
    let i = ok(no_token, ImportFormat::Jsonl);
    assert_eq!(i.summary.tokens, 2);
    assert!(!i.summary.weights);
    assert_eq!(demands(&i.records)[1], [(0, vec![3])]);
    // Positions restarting (a second sequence) are new tokens too.
    let restart = concat!(
        "{\"pos\": 0, \"layer_id\": 0, \"expert_ids\": [1]}\n",
        "{\"pos\": 1, \"layer_id\": 0, \"expert_ids\": [2]}\n",
        "{\"pos\": 0, \"layer_id\": 0, \"expert_ids\": [3]}\n"
    );
    assert_eq!(ok(restart, ImportFormat::Jsonl).summary.tokens, 3);
}

#[test]
fn jsonl_faults_name_their_line() {
    let cut = &PER_ROUTE[..PER_ROUTE.len() - 20];
    let (at, what) = err(cut.as_bytes(), ImportFormat::Jsonl, flat(None));
    assert_eq!(at, Loc::Line(4));
    assert!(what.contains("cut off"), "{what}");
    let missing = format!("{PER_ROUTE}{{\"token_idx\": 2, \"layer\": 0, \"experts\": [1, 2]}}\n");
    let (at, what) = err(missing.as_bytes(), ImportFormat::Jsonl, flat(None));
    assert_eq!(at, Loc::Line(5));
    assert!(what.contains("`weights`"), "{what}");
    let (at, what) = err(PER_ROUTE.as_bytes(), ImportFormat::Jsonl, flat(Some(5)));
    assert_eq!(at, Loc::Line(3));
    assert!(what.contains("expert 5 out of range"), "{what}");
    let k3 = "{\"layer\": 0, \"experts\": [1, 2]}\n{\"layer\": 0, \"experts\": [1, 2, 3]}\n";
    let (at, what) = err(k3.as_bytes(), ImportFormat::Jsonl, flat(None));
    assert_eq!(at, Loc::Line(2));
    assert!(what.contains("k must not change"), "{what}");
    let (_, what) = err(
        b"{\"layer\": 0, \"ids\": [1]}",
        ImportFormat::Jsonl,
        flat(None),
    );
    assert!(what.contains("no expert ids"), "{what}");
    let neg = "{\"layer\": 0, \"experts\": [1, -2]}";
    let (_, what) = err(neg.as_bytes(), ImportFormat::Jsonl, flat(None));
    assert!(what.contains("-2"), "{what}");
    let twice = "{\"token\": 0, \"layer\": 0, \"experts\": [1]}\n{\"token\": 0, \"layer\": 0, \"experts\": [2]}";
    let (at, what) = err(twice.as_bytes(), ImportFormat::Jsonl, flat(None));
    assert_eq!(at, Loc::Line(2));
    assert!(what.contains("twice"), "{what}");
}

#[test]
fn empty_inputs_and_one_k_per_trace() {
    for f in [ImportFormat::Auto, ImportFormat::Jsonl, ImportFormat::Csv] {
        let (at, what) = err(b"  \n", f, flat(None));
        assert_eq!(at, Loc::Input, "{f:?}");
        assert!(what.contains("no r") || what.contains("empty"), "{what}");
    }
    let ks = "{\"layer\": 0, \"experts\": [1, 2]}\n{\"layer\": 1, \"experts\": [1, 2, 3]}\n";
    let (_, what) = err(ks.as_bytes(), ImportFormat::Jsonl, flat(None));
    assert!(what.contains("one k"), "{what}");
}

#[test]
fn arrays_bare_or_under_a_key_with_weights() {
    let bare = "[[[1, 2], [3, 0]], [[2, 1], [0, 3]], [[1, 0], [2, 3]]]";
    let i = ok(bare, ImportFormat::Auto);
    assert_eq!(i.summary.format, ImportFormat::Array);
    assert_eq!((i.summary.tokens, i.summary.layers, i.summary.k), (3, 2, 2));
    assert_eq!(demands(&i.records)[2], [(0, vec![1, 0]), (1, vec![2, 3])]);
    let keyed = "{\"routed_experts\": [[[1], [2]]], \"routed_weights\": [[[1.0], [1.0]]]}";
    let i = ok(keyed, ImportFormat::Auto);
    assert_eq!(i.summary.format, ImportFormat::Array);
    assert!(i.summary.weights);
    assert!(i.summary.spelling.contains("`routed_experts`"));
    let ragged = "[[[1, 2], [3, 0]], [[2, 1], [0]]]";
    let (at, what) = err(ragged.as_bytes(), ImportFormat::Array, flat(None));
    assert_eq!(at, Loc::Entry { token: 1, layer: 1 });
    assert!(what.contains("k must not change"), "{what}");
    let cut = "{\"routed_experts\": [[[1, 2],\n [3, 0]], [[2,";
    let (at, what) = err(cut.as_bytes(), ImportFormat::Array, flat(None));
    assert_eq!(at, Loc::Line(2));
    assert!(what.contains("truncated"), "{what}");
}

/// A `.npy` of `shape` with `dtype`'s little-endian elements.
fn npy(dtype: &str, shape: [usize; 3], data: &[i64], bytes: usize) -> Vec<u8> {
    let dict = format!(
        "{{'descr': '{dtype}', 'fortran_order': False, 'shape': ({}, {}, {}), }}",
        shape[0], shape[1], shape[2]
    );
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16 + 1).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.push(b'\n');
    for v in data {
        out.extend_from_slice(&v.to_le_bytes()[..bytes]);
    }
    out
}

#[test]
fn npy_int32_and_int64_and_their_faults() {
    let data = [1, 2, 3, 0, 2, 1, 0, 3];
    for (dtype, bytes) in [("<i8", 8), ("<i4", 4), ("<u2", 2)] {
        let f = npy(dtype, [2, 2, 2], &data, bytes);
        let i = import(&f, ImportFormat::Auto, flat(None)).unwrap();
        assert_eq!((i.summary.tokens, i.summary.layers, i.summary.k), (2, 2, 2));
        assert_eq!(demands(&i.records)[1], [(0, vec![2, 1]), (1, vec![0, 3])]);
    }
    let f = npy("<i8", [2, 2, 2], &data, 8);
    let (at, what) = err(&f[..f.len() - 3], ImportFormat::Array, flat(None));
    assert_eq!(at, Loc::Byte(f.len() as u64 - 3));
    assert!(what.contains("truncated"), "{what}");
    let (_, what) = err(
        &npy(">i8", [2, 2, 2], &data, 8),
        ImportFormat::Array,
        flat(None),
    );
    assert!(what.contains("little-endian"), "{what}");
    let neg = npy("<i4", [1, 1, 2], &[1, -1], 4);
    let (at, what) = err(&neg, ImportFormat::Array, flat(None));
    assert_eq!(at, Loc::Byte(neg.len() as u64 - 4));
    assert!(what.contains("negative"), "{what}");
    let (_, what) = err(&f[..9], ImportFormat::Array, flat(None));
    assert!(what.contains("cut off"), "{what}");
}

#[test]
fn csv_with_and_without_header() {
    let plain = "0,3\n0,1\n1,2\n1,0\n0,1\n0,2\n1,3\n1,0\n";
    let i = ok(plain, ImportFormat::Auto);
    assert_eq!(i.summary.format, ImportFormat::Csv);
    assert_eq!((i.summary.tokens, i.summary.layers, i.summary.k), (2, 2, 2));
    assert_eq!(demands(&i.records)[0], [(0, vec![3, 1]), (1, vec![2, 0])]);
    let named = "token,layer,expert,weight\n7,0,3,0.5\n7,0,1,0.5\n8,0,2,0.9\n8,0,0,0.1\n";
    let i = ok(named, ImportFormat::Csv);
    assert_eq!((i.summary.tokens, i.summary.layers, i.summary.k), (2, 1, 2));
    assert!(i.summary.weights);
    assert!(i
        .summary
        .spelling
        .contains("token,layer,expert,weight (header)"));
    let bad = "0,3\n0,1\n1,x\n";
    let (at, what) = err(bad.as_bytes(), ImportFormat::Csv, flat(None));
    assert_eq!(at, Loc::Line(3));
    assert!(what.contains("`x`"), "{what}");
    let short = "0,3\n0,1\n1\n";
    assert_eq!(
        err(short.as_bytes(), ImportFormat::Csv, flat(None)).0,
        Loc::Line(3)
    );
    let k = "0,3\n0,1\n1,2\n1,0\n0,1\n0,2\n0,3\n1,3\n1,0\n";
    let (at, what) = err(k.as_bytes(), ImportFormat::Csv, flat(None));
    assert_eq!(at, Loc::Line(5));
    assert!(what.contains("k must not change"), "{what}");
    let range = "0,3\n0,1\n1,2\n1,4\n";
    let (at, what) = err(range.as_bytes(), ImportFormat::Csv, flat(Some(4)));
    assert_eq!(at, Loc::Line(3));
    assert!(what.contains("expert 4 out of range"), "{what}");
}

fn model() -> TraceHeader {
    TraceHeader {
        n_expert: 8,
        k: 4,
        trunk_layers: 3,
        slot_bytes: vec![0, 100, 100, 100],
        model_bytes: 12345,
        model_name: "m.gguf".into(),
    }
}

#[test]
fn like_a_model_takes_its_sizes_and_maps_moe_layer_ordinals() {
    let same = "{\"layer\": 1, \"experts\": [7, 0]}\n{\"layer\": 2, \"experts\": [1, 2]}\n";
    let i = import(same.as_bytes(), ImportFormat::Auto, Sizes::Like(model())).unwrap();
    assert_eq!(i.header, TraceHeader { k: 2, ..model() });
    assert!(i.summary.notes.is_empty());
    let ordinal = "{\"layer\": 0, \"experts\": [7, 0]}\n{\"layer\": 1, \"experts\": [1, 2]}\n";
    let i = import(ordinal.as_bytes(), ImportFormat::Auto, Sizes::Like(model())).unwrap();
    assert_eq!(demands(&i.records)[0], [(1, vec![7, 0]), (2, vec![1, 2])]);
    assert!(
        i.summary.notes[0].contains("MoE layers"),
        "{:?}",
        i.summary.notes
    );
    let beyond = "{\"layer\": 0, \"experts\": [1]}\n{\"layer\": 3, \"experts\": [1]}\n";
    let (_, what) = err(beyond.as_bytes(), ImportFormat::Auto, Sizes::Like(model()));
    assert!(what.contains("no experts in m.gguf"), "{what}");
    let (at, what) = err(
        b"{\"layer\": 1, \"experts\": [8]}",
        ImportFormat::Auto,
        Sizes::Like(model()),
    );
    assert_eq!(at, Loc::Line(1));
    assert!(what.contains("out of range"), "{what}");
}

#[test]
fn an_import_round_trips_through_the_trace_file() {
    for (input, format) in [
        (PER_ROUTE, ImportFormat::Jsonl),
        ("0,3\n0,1\n1,2\n1,0\n0,1\n0,2\n", ImportFormat::Csv),
    ] {
        let i = ok(input, format);
        let mut w = TraceWriter::new(Vec::new(), i.header.clone()).unwrap();
        for r in &i.records {
            w.record(r).unwrap();
        }
        let bytes = w.into_inner();
        let (h, back) = TraceReader::new(&bytes[..]).unwrap().records().unwrap();
        assert_eq!(h, i.header);
        assert_eq!(back, i.records);
        assert_eq!(demands(&back), demands(&i.records));
    }
}

#[test]
fn detect_tells_the_formats_apart() {
    assert_eq!(detect(PER_ROUTE.as_bytes()).unwrap(), ImportFormat::Jsonl);
    assert_eq!(detect(b"  [[[1]]]").unwrap(), ImportFormat::Array);
    assert_eq!(
        detect(b"{\"routed_experts\": [[[1]]]}").unwrap(),
        ImportFormat::Array
    );
    assert_eq!(
        detect(b"{\n \"routed_experts\": [[[1]]]\n}").unwrap(),
        ImportFormat::Array
    );
    assert_eq!(detect(b"layer,expert\n0,1\n").unwrap(), ImportFormat::Csv);
    assert!(detect(b"").is_err());
    assert_eq!("csv".parse::<ImportFormat>().unwrap(), ImportFormat::Csv);
    assert!("xml".parse::<ImportFormat>().is_err());
}

#[test]
fn a_byte_order_mark_is_skipped_before_the_format_is_told() {
    let with_bom = |s: &str| [b"\xEF\xBB\xBF".as_slice(), s.as_bytes()].concat();
    for (input, format) in [
        (PER_ROUTE, ImportFormat::Jsonl),
        ("layer,expert\n0,3\n0,1\n1,2\n1,0\n", ImportFormat::Csv),
        ("[[[1, 2], [3, 0]]]", ImportFormat::Array),
    ] {
        assert_eq!(detect(&with_bom(input)).unwrap(), format, "{input}");
        let plain = import(input.as_bytes(), ImportFormat::Auto, flat(None)).unwrap();
        let bom = import(&with_bom(input), ImportFormat::Auto, flat(None)).unwrap();
        assert_eq!(bom.records, plain.records, "{input}");
        assert_eq!(bom.summary, plain.summary, "{input}");
    }
}

#[test]
fn an_expert_twice_in_one_route_is_refused_with_its_line() {
    let jsonl = "{\"layer\": 0, \"experts\": [1, 3]}\n{\"layer\": 1, \"experts\": [2, 2]}\n";
    let (at, what) = err(jsonl.as_bytes(), ImportFormat::Auto, flat(None));
    assert_eq!(at, Loc::Line(2));
    assert!(what.contains("expert 2 twice in layer 1"), "{what}");
    let csv = "0,1\n0,3\n1,2\n1,2\n";
    let (at, what) = err(csv.as_bytes(), ImportFormat::Csv, flat(None));
    assert_eq!(at, Loc::Line(3));
    assert!(what.contains("expert 2 twice"), "{what}");
    let (at, _) = err(b"[[[0, 1]], [[4, 4]]]", ImportFormat::Array, flat(None));
    assert_eq!(at, Loc::Entry { token: 1, layer: 0 });
}

#[test]
fn layer_ids_and_sizes_that_would_size_a_huge_trace_are_refused() {
    for (input, line) in [
        ("{\"layer\": 4000000000, \"experts\": [1]}\n", 1),
        (
            "{\"layer\": 0, \"experts\": [1]}\n{\"layer\": 100000000, \"experts\": [1]}\n",
            2,
        ),
        ("0,4294967295,1\n", 1),
    ] {
        let (at, what) = err(input.as_bytes(), ImportFormat::Auto, flat(None));
        assert_eq!(at, Loc::Line(line), "{input}");
        assert!(
            what.contains("out of range: a route trace holds 65536 layers"),
            "{what}"
        );
    }
    // The last layer a trace holds is taken.
    let last = "{\"layer\": 65535, \"experts\": [1]}\n";
    let i = import(last.as_bytes(), ImportFormat::Auto, flat(None)).unwrap();
    assert_eq!(i.header.slot_bytes.len(), 65536);
    // With a model, its own layers bound the ids.
    let (_, what) = err(
        b"{\"layer\": 4, \"experts\": [1]}",
        ImportFormat::Auto,
        Sizes::Like(model()),
    );
    assert!(what.contains("m.gguf has 4 layers"), "{what}");
    // More (layer, expert) slots than a replay's tables should hold.
    let many = Sizes::Flat {
        slot_bytes: 1,
        n_expert: Some(MAX_EXPERTS),
        name: "log".into(),
    };
    let (at, what) = err(
        b"300,1
",
        ImportFormat::Csv,
        many,
    );
    assert_eq!(at, Loc::Input);
    assert!(what.contains("expert slots"), "{what}");
    // Slot sizes whose products pass 64 bits (or the trace's bound).
    for slot_bytes in [u64::MAX, i64::MAX as u64, 1 << 60] {
        let sizes = Sizes::Flat {
            slot_bytes,
            n_expert: None,
            name: "log".into(),
        };
        let (at, what) = err(b"0,3\n1,2\n", ImportFormat::Csv, sizes);
        assert_eq!(at, Loc::Input);
        assert!(what.contains("give the real size of one expert"), "{what}");
    }
}
