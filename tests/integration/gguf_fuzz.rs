//! The gguf header parser (ggml's reader behind `GgufFile`) and the expert
//! layout derived from it, under mutated real headers: the E8K2 fixture's
//! header with its counts, string and array lengths, value and tensor types,
//! dimensions, offsets and alignment overwritten with hostile values, bytes
//! flipped, and the file cut short. Whatever the bytes: no panic or abort, a
//! file bmoe accepts has every expert slice inside it, and a file it refuses
//! gets an exit-4 error (not a gguf / corrupt / truncated) naming the file.
//! `fuzz/` holds the cargo-fuzz target over the same code.

use std::path::Path;

use bmoe::layout::MoeLayout;
use bmoe::llama::gguf::GgufFile;
use bmoe::llama::LlamaError;
use proptest::prelude::*;

use crate::common::e8k2;

/// What a header field is (how wide it is, what its values mean).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Version,
    TensorCount,
    KvCount,
    StrLen,
    ValueType,
    ArrayType,
    ArrayLen,
    Alignment,
    /// An integer metadata value (block_count, expert_count, ...).
    Int32,
    Int64,
    NDims,
    Dim,
    TensorType,
    Offset,
}

impl Kind {
    fn width(self) -> usize {
        match self {
            Kind::Version
            | Kind::ValueType
            | Kind::ArrayType
            | Kind::Alignment
            | Kind::Int32
            | Kind::NDims
            | Kind::TensorType => 4,
            _ => 8,
        }
    }
}

/// One field of the header: where it is and what it is.
#[derive(Debug, Clone)]
struct Field {
    pos: usize,
    kind: Kind,
    /// The metadata key a value field belongs to (empty otherwise).
    key: String,
}

/// A walk over a well-formed gguf header, recording its fields (of each
/// array, the first few elements only).
struct Walker<'a> {
    b: &'a [u8],
    pos: usize,
    fields: Vec<Field>,
    key: String,
}

impl Walker<'_> {
    fn take(&mut self, kind: Kind) -> u64 {
        let w = kind.width();
        self.fields.push(Field {
            pos: self.pos,
            kind,
            key: self.key.clone(),
        });
        let mut v = [0u8; 8];
        v[..w].copy_from_slice(&self.b[self.pos..self.pos + w]);
        self.pos += w;
        u64::from_le_bytes(v)
    }

    fn string(&mut self, record: bool) -> String {
        let len = if record {
            self.take(Kind::StrLen)
        } else {
            let v = u64::from_le_bytes(self.b[self.pos..self.pos + 8].try_into().unwrap());
            self.pos += 8;
            v
        } as usize;
        let s = String::from_utf8_lossy(&self.b[self.pos..self.pos + len]).into_owned();
        self.pos += len;
        s
    }

    /// Skip one value of gguf type `ty` (recording scalars only when `record`).
    fn value(&mut self, ty: u64, record: bool) {
        match ty {
            0 | 1 | 7 => self.pos += 1,
            2 | 3 => self.pos += 2,
            4 | 5 if record => {
                self.take(Kind::Int32);
            }
            10 | 11 if record => {
                self.take(Kind::Int64);
            }
            4..=6 => self.pos += 4,
            10..=12 => self.pos += 8,
            8 => {
                self.string(record);
            }
            9 => {
                let ety = self.take(Kind::ArrayType);
                let n = self.take(Kind::ArrayLen);
                for i in 0..n {
                    self.value(ety, record && i < 4);
                }
            }
            _ => panic!("unknown gguf type {ty} in a well-formed header"),
        }
    }

    fn walk(b: &[u8]) -> Vec<Field> {
        let mut w = Walker {
            b,
            pos: 4,
            fields: Vec::new(),
            key: String::new(),
        };
        w.take(Kind::Version);
        let n_tensors = w.take(Kind::TensorCount);
        let n_kv = w.take(Kind::KvCount);
        for _ in 0..n_kv {
            w.key.clear();
            let key = w.string(true);
            w.key = key.clone();
            let ty = w.take(Kind::ValueType);
            if key == "general.alignment" {
                w.take(Kind::Alignment);
            } else {
                w.value(ty, true);
            }
        }
        w.key.clear();
        for _ in 0..n_tensors {
            w.string(true);
            let n_dims = w.take(Kind::NDims);
            for _ in 0..n_dims {
                w.take(Kind::Dim);
            }
            w.take(Kind::TensorType);
            w.take(Kind::Offset);
        }
        w.fields
    }
}

/// The E8K2 fixture's header, then this much of its tensor data.
const DATA_KEPT: usize = 64 * 1024;

/// The real header bytes (up to the data offset plus `DATA_KEPT`), its fields,
/// and the data offset.
fn real_header() -> &'static (Vec<u8>, Vec<Field>, usize) {
    static H: std::sync::OnceLock<(Vec<u8>, Vec<Field>, usize)> = std::sync::OnceLock::new();
    H.get_or_init(|| {
        let g = GgufFile::open(e8k2()).unwrap();
        let data = g.data_offset() as usize;
        let mut f = std::fs::File::open(e8k2()).unwrap();
        let mut b = vec![0u8; data + DATA_KEPT];
        std::io::Read::read_exact(&mut f, &mut b).unwrap();
        let fields = Walker::walk(&b[..data]);
        (b, fields, data)
    })
}

/// One change to the header.
#[derive(Debug, Clone)]
enum Mutation {
    /// Overwrite field `i % fields` with a hostile value.
    Field(usize, u64),
    /// Overwrite integer metadata value `i % values` (the hyperparameters) with
    /// a hostile value: ggml's reader cannot check these against the tensors.
    Meta(usize, u64),
    /// Add a small signed amount to field `i % fields` (a plausible wrong value).
    Nudge(usize, i8),
    /// Overwrite byte `pos % len`.
    Byte(usize, u8),
    /// Cut the file to `pos % len` bytes.
    Cut(usize),
}

fn hostile_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(3),
        Just(31),
        Just(255),
        Just(4097),
        Just(0x7fff_ffff),
        Just(0xffff_ffff),
        Just(1 << 32),
        Just(1 << 40),
        Just(i64::MAX as u64),
        Just(u64::MAX),
        Just(u64::MAX - 7),
        any::<u64>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), hostile_value()).prop_map(|(i, v)| Mutation::Meta(i, v)),
        3 => (any::<usize>(), hostile_value()).prop_map(|(i, v)| Mutation::Field(i, v)),
        3 => (any::<usize>(), any::<i8>()).prop_map(|(i, d)| Mutation::Nudge(i, d)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(p, v)| Mutation::Byte(p, v)),
        1 => any::<usize>().prop_map(Mutation::Cut),
    ]
}

fn apply(bytes: &mut Vec<u8>, fields: &[Field], m: &Mutation) {
    match *m {
        Mutation::Meta(i, v) => {
            let ints: Vec<&Field> = fields
                .iter()
                .filter(|f| matches!(f.kind, Kind::Int32 | Kind::Int64))
                .collect();
            let f = ints[i % ints.len()];
            let w = f.kind.width();
            if f.pos + w <= bytes.len() {
                bytes[f.pos..f.pos + w].copy_from_slice(&v.to_le_bytes()[..w]);
            }
        }
        Mutation::Field(i, v) => {
            let f = &fields[i % fields.len()];
            let w = f.kind.width();
            if f.pos + w <= bytes.len() {
                bytes[f.pos..f.pos + w].copy_from_slice(&v.to_le_bytes()[..w]);
            }
        }
        Mutation::Nudge(i, d) => {
            let f = &fields[i % fields.len()];
            let w = f.kind.width();
            if f.pos + w <= bytes.len() {
                let mut v = [0u8; 8];
                v[..w].copy_from_slice(&bytes[f.pos..f.pos + w]);
                let v = u64::from_le_bytes(v).wrapping_add(d as i64 as u64);
                bytes[f.pos..f.pos + w].copy_from_slice(&v.to_le_bytes()[..w]);
            }
        }
        Mutation::Byte(p, v) => {
            if !bytes.is_empty() {
                let n = bytes.len();
                bytes[p % n] = v;
            }
        }
        Mutation::Cut(p) => {
            let n = bytes.len().max(1);
            bytes.truncate(p % n);
        }
    }
}

/// Open `path` as every command does (header, completeness, layout check).
fn open_like_bmoe(path: &Path) -> Result<MoeLayout, LlamaError> {
    MoeLayout::open(path)
}

/// How often each outcome came up (printed, to show what the cases reached).
static OUTCOMES: std::sync::Mutex<std::collections::BTreeMap<String, u32>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// What must hold for any bytes at `path` (`len` long).
fn check_outcome(path: &Path, len: u64) -> Result<(), TestCaseError> {
    let outcome = open_like_bmoe(path);
    let tag = match &outcome {
        Ok(_) => "accepted".to_string(),
        Err(e) => format!("{e}")
            .split(": ")
            .nth(1)
            .unwrap_or("")
            .chars()
            .take(40)
            .collect(),
    };
    *OUTCOMES.lock().unwrap().entry(tag).or_default() += 1;
    match outcome {
        Ok(layout) => {
            for e in &layout.experts {
                let end = e.slice_offset(e.n_expert);
                prop_assert!(end <= len, "{}: slices end at {end} > {len}", e.name);
            }
            // The derived figures are computable without overflow.
            let _ = (
                layout.expert_bytes(),
                layout.dense_bytes(),
                layout.routed_bytes_per_token(),
                layout.routed_bytes_per_mtp_pass(),
            );
        }
        Err(e) => {
            let exit4 = matches!(
                e,
                LlamaError::NotGguf { .. }
                    | LlamaError::Truncated { .. }
                    | LlamaError::Corrupt { .. }
            );
            prop_assert!(exit4, "not an exit-4 error: {e:?}");
            let name = path.file_name().unwrap().to_string_lossy();
            prop_assert!(e.to_string().contains(&*name), "{e} does not name the file");
        }
    }
    Ok(())
}

#[test]
fn mutated_real_headers_are_refused_clearly_or_stay_inside_the_file() {
    let (bytes, fields, _) = real_header();
    assert!(fields.len() > 302 * 4, "walked {} fields", fields.len());
    // The unmutated header (cut to DATA_KEPT of data) is refused as truncated.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mutated.gguf");
    std::fs::write(&path, bytes).unwrap();
    assert!(matches!(
        open_like_bmoe(&path),
        Err(LlamaError::Truncated { .. })
    ));
    let cfg = ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(cfg, |(muts in proptest::collection::vec(mutation(), 1..4), pad in any::<bool>())| {
        let mut b = bytes.clone();
        for m in &muts {
            apply(&mut b, fields, m);
        }
        std::fs::write(&path, &b).unwrap();
        let mut len = b.len() as u64;
        let values_only = muts.iter().all(|m| matches!(m, Mutation::Meta(..)));
        if pad && values_only {
            // As long as the real file (sparse): the tensor table fits, so the
            // layout's own checks, not truncation, must catch what is wrong.
            // (Only when the structure is intact: a hostile count would make
            // ggml's reader walk the whole padded file, which is slow, not wrong.)
            len = e8k2_len();
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.set_len(len).unwrap();
        }
        check_outcome(&path, len)?;
    });
    println!("outcomes over the cases: {:#?}", OUTCOMES.lock().unwrap());
}

fn e8k2_len() -> u64 {
    std::fs::metadata(e8k2()).unwrap().len()
}

#[test]
fn hyperparameters_that_disagree_with_the_tensors_are_refused_before_llama_cpp() {
    let (bytes, fields, _) = real_header();
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, u64, &str); 6] = [
        ("llama.expert_used_count", 0, "expert_used_count is 0"),
        (
            "llama.expert_used_count",
            9,
            "expert_used_count 9 exceeds expert_count 8",
        ),
        ("llama.expert_count", 0, "exceeds expert_count 0"),
        (
            "llama.expert_count",
            16,
            "stacks 8 experts but expert_count is 16",
        ),
        (
            "llama.block_count",
            0,
            "block_count is 0 but the tensor table has 30 blocks",
        ),
        ("llama.block_count", 1000, "block_count is 1000"),
    ];
    for (key, value, want) in cases {
        let f = fields
            .iter()
            .find(|f| f.key == key && matches!(f.kind, Kind::Int32 | Kind::Int64))
            .unwrap_or_else(|| panic!("{key} in the header"));
        let mut b = bytes.clone();
        let w = f.kind.width();
        b[f.pos..f.pos + w].copy_from_slice(&value.to_le_bytes()[..w]);
        let path = dir.path().join(format!("{key}-{value}.gguf"));
        std::fs::write(&path, &b).unwrap();
        // As long as the real file (sparse), so only the value is wrong.
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(e8k2_len()).unwrap();
        let o = crate::common::bmoe_within(
            &["run", "-m", path.to_str().unwrap(), "-p", "x", "-n", "1"],
            60,
        );
        let err = crate::common::stderr(&o);
        assert_eq!(o.status.code(), Some(4), "{key}={value}: {err}");
        assert!(
            err.contains(want) && err.contains("corrupt gguf header"),
            "{key}={value}: {err}"
        );
    }
}

/// Fuzzing findings, kept as regression inputs (tests/data/fuzz-*.gguf): each
/// once crashed bmoe (an abort inside ggml, a panic on overflow); now each is
/// an exit-4 error saying why.
#[test]
fn fuzz_findings_are_refused_with_exit_4() {
    let cases = [
        (
            "fuzz-elements-overflow.gguf",
            "more elements than fit in 64 bits",
        ),
        // A slice (row bytes x rows) past u64: a panic on overflow in bmoe.
        ("fuzz-slice-bytes-overflow.gguf", "stacks 0 experts"),
    ];
    for (file, want) in cases {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(file);
        let o = crate::common::bmoe(&["inspect", path.to_str().unwrap()]);
        let err = crate::common::stderr(&o);
        assert_eq!(o.status.code(), Some(4), "{file}: {err}");
        assert!(err.contains(want), "{file}: {err}");
    }
}
