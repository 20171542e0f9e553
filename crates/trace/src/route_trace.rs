//! The route trace (`bmoe run --route-trace FILE`): every expert demand of a
//! run's verify decodes, in order, so `bmoe replay` can size the cache and
//! compare policies without the model.
//!
//! Format (all integers little-endian):
//!
//! ```text
//! header : "BMOERTR1" (8 bytes)
//!          u32 n_expert        experts per MoE layer
//!          u32 k               experts routed per token
//!          u32 n_layers        layers with a slot size below (trunk + MTP head)
//!          u32 trunk_layers    the trunk's layers (a prompt's batch runs through them)
//!          u64 slot_bytes[n_layers]   bytes of one expert of each layer (0: no experts)
//!          u64 model_bytes     size of the model file(s)
//!          u16 name_len, name[name_len]   the model's file name, UTF-8
//! records: u8 tag, then
//!          tag 1 (demand)     : u32 layer, u32 n_ids, u16 ids[n_ids]
//!                               the routed ids of every row of the batch, row
//!                               after row (k per row, so rows = n_ids / k)
//!          tag 2 (decode end) : u32 rows (tokens the decode processed),
//!                               u32 outputs (rows of its last demand: the rows
//!                               whose logits were computed; fewer than rows
//!                               in a prompt's decode, all of them in a verify)
//!          tag 3 (weights)    : u32 layer, u32 n, f32 w[n]   (optional)
//!                               the router weights of the demand just before
//!                               it (same layer, one weight per routed id);
//!                               written by `bmoe trace import` when the
//!                               imported log has them
//! ```
//!
//! Tag 3 is newer than the rest: a trace without it reads as before, and an
//! older bmoe refuses a trace with it as an unknown tag.
//!
//! The file ends after a whole record; anything else is [`TraceError::Truncated`].

use std::io::{self, Read, Write};

const MAGIC: &[u8; 8] = b"BMOERTR1";
const TAG_DEMAND: u8 = 1;
const TAG_DECODE_END: u8 = 2;
const TAG_WEIGHTS: u8 = 3;
/// Expert ids are stored as u16.
pub const MAX_EXPERTS: u32 = u16::MAX as u32 + 1;
/// The most layers a header holds (a reader refuses more: the slot sizes
/// are read before anything else could tell a real header from noise).
pub const MAX_LAYERS: u32 = 1 << 16;
/// The most (layer, expert) slots a trace describes: 2^24, a thousand times
/// DeepSeek-V3's 61 x 256, and few enough that a replay's per-slot tables
/// (counts per layer and expert) stay within tens of MiB.
pub const MAX_SLOTS: u64 = 1 << 24;
/// The most bytes of experts (every layer's slot x the experts) a trace's
/// model may hold: 1 EiB, far beyond any model, and low enough that a
/// replay's sums of slot sizes (a budget, what is resident plus a demand)
/// never pass 64 bits.
pub const MAX_EXPERT_BYTES: u64 = 1 << 60;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("route trace I/O: {0}")]
    Io(#[from] io::Error),
    #[error("not a bmoe route trace (bad magic; expected {expected:?})", expected = String::from_utf8_lossy(MAGIC))]
    BadMagic,
    #[error("route trace truncated at byte {offset} (the run writing it stopped mid-record?)")]
    Truncated { offset: u64 },
    #[error("route trace record {index}: {what}")]
    Corrupt { index: u64, what: String },
    #[error("route trace header: {0}")]
    Header(String),
}

/// What a replay needs to know about the model that made the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceHeader {
    pub n_expert: u32,
    pub k: u32,
    /// Layers of the trunk (the rest of `slot_bytes` are MTP head layers).
    pub trunk_layers: u32,
    /// Bytes of one expert of each layer (0 where a layer has none).
    pub slot_bytes: Vec<u64>,
    pub model_bytes: u64,
    pub model_name: String,
}

impl TraceHeader {
    /// Bytes of every expert of every layer (saturating: a header that
    /// passed [`TraceHeader::check`] is at most [`MAX_EXPERT_BYTES`]).
    pub fn expert_bytes(&self) -> u64 {
        self.checked_expert_bytes().unwrap_or(u64::MAX)
    }

    fn checked_expert_bytes(&self) -> Option<u64> {
        self.slot_bytes.iter().try_fold(0u64, |sum, &b| {
            sum.checked_add(b.checked_mul(u64::from(self.n_expert))?)
        })
    }

    /// Why this trace is not one of the model `model` describes (None when
    /// the experts per layer and every layer's expert size agree; k may
    /// differ: a run with `--n-expert-used` records its own).
    pub fn differs_from(&self, model: &TraceHeader) -> Option<String> {
        let shape = |h: &TraceHeader| {
            let moe = h.slot_bytes.iter().filter(|&&b| b > 0).count();
            format!(
                "{moe} MoE layers of {} x {} experts",
                h.slot_bytes.len(),
                h.n_expert
            )
        };
        if self.n_expert != model.n_expert || self.slot_bytes.len() != model.slot_bytes.len() {
            return Some(format!(
                "the trace has {} ({}), the model {} ({})",
                shape(self),
                self.model_name,
                shape(model),
                model.model_name
            ));
        }
        let l = (0..self.slot_bytes.len()).find(|&l| self.slot_bytes[l] != model.slot_bytes[l])?;
        Some(format!(
            "layer {l}'s experts are {} bytes in the trace ({}), {} in the model ({})",
            self.slot_bytes[l], self.model_name, model.slot_bytes[l], model.model_name
        ))
    }

    /// What the format holds and a replay can compute with: 1..=MAX_EXPERTS
    /// experts, k >= 1, at most MAX_LAYERS layers and MAX_SLOTS slots, at most MAX_EXPERT_BYTES
    /// bytes of experts (checked by the writer and the reader alike).
    pub fn check(&self) -> Result<(), TraceError> {
        let bad = |what: String| Err(TraceError::Header(what));
        if self.n_expert == 0 || self.n_expert > MAX_EXPERTS || self.k == 0 {
            return bad(format!(
                "{} experts, {} per token: a trace holds 1..={MAX_EXPERTS} experts and k >= 1",
                self.n_expert, self.k
            ));
        }
        if self.slot_bytes.len() > MAX_LAYERS as usize {
            return bad(format!(
                "{} layers: a trace holds at most {MAX_LAYERS}",
                self.slot_bytes.len()
            ));
        }
        let slots = self.slot_bytes.len() as u64 * u64::from(self.n_expert);
        if slots > MAX_SLOTS {
            return bad(format!(
                "{} layers x {} experts: a trace describes at most {MAX_SLOTS} expert slots",
                self.slot_bytes.len(),
                self.n_expert
            ));
        }
        match self.checked_expert_bytes() {
            Some(b) if b <= MAX_EXPERT_BYTES => Ok(()),
            _ => bad(format!(
                "its experts ({} per layer, slot sizes up to {} bytes, {} layers) pass the \
                 {MAX_EXPERT_BYTES} bytes a trace may describe: the slot sizes are not a real \
                 model's",
                self.n_expert,
                self.slot_bytes.iter().max().copied().unwrap_or(0),
                self.slot_bytes.len()
            )),
        }
    }
}

/// One record of the trace.
#[derive(Debug, Clone, PartialEq)]
pub enum TraceRecord {
    /// A layer's routing for every row of the batch (k ids per row).
    Demand { layer: u32, ids: Vec<u16> },
    /// A decode ended after processing `rows` tokens, `outputs` of them with logits.
    DecodeEnd { rows: u32, outputs: u32 },
    /// The router weights of the demand just before (one per routed id).
    Weights { layer: u32, weights: Vec<f32> },
}

/// Appends records to a trace.
pub struct TraceWriter<W: Write> {
    out: W,
    header: TraceHeader,
}

impl<W: Write> TraceWriter<W> {
    /// Write the header; the model must fit the format (ids as u16).
    pub fn new(mut out: W, header: TraceHeader) -> Result<Self, TraceError> {
        header.check()?;
        let name = header.model_name.as_bytes();
        let name = &name[..name.len().min(u16::MAX as usize)];
        out.write_all(MAGIC)?;
        out.write_all(&header.n_expert.to_le_bytes())?;
        out.write_all(&header.k.to_le_bytes())?;
        out.write_all(&(header.slot_bytes.len() as u32).to_le_bytes())?;
        out.write_all(&header.trunk_layers.to_le_bytes())?;
        for b in &header.slot_bytes {
            out.write_all(&b.to_le_bytes())?;
        }
        out.write_all(&header.model_bytes.to_le_bytes())?;
        out.write_all(&(name.len() as u16).to_le_bytes())?;
        out.write_all(name)?;
        Ok(Self { out, header })
    }

    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// A layer's routed ids, every row of the batch (each id < n_expert).
    pub fn demand(
        &mut self,
        layer: u32,
        ids: impl ExactSizeIterator<Item = u32>,
    ) -> Result<(), TraceError> {
        self.out.write_all(&[TAG_DEMAND])?;
        self.out.write_all(&layer.to_le_bytes())?;
        self.out.write_all(&(ids.len() as u32).to_le_bytes())?;
        for e in ids {
            debug_assert!(e < self.header.n_expert);
            self.out.write_all(&(e as u16).to_le_bytes())?;
        }
        Ok(())
    }

    /// The router weights of the demand just written (same layer, one per id).
    pub fn weights(&mut self, layer: u32, weights: &[f32]) -> Result<(), TraceError> {
        self.out.write_all(&[TAG_WEIGHTS])?;
        self.out.write_all(&layer.to_le_bytes())?;
        self.out.write_all(&(weights.len() as u32).to_le_bytes())?;
        for w in weights {
            self.out.write_all(&w.to_le_bytes())?;
        }
        Ok(())
    }

    /// Write one record.
    pub fn record(&mut self, r: &TraceRecord) -> Result<(), TraceError> {
        match r {
            TraceRecord::Demand { layer, ids } => {
                self.demand(*layer, ids.iter().map(|&e| u32::from(e)))
            }
            TraceRecord::DecodeEnd { rows, outputs } => self.decode_end(*rows, *outputs),
            TraceRecord::Weights { layer, weights } => self.weights(*layer, weights),
        }
    }

    /// The decode ended after `rows` tokens, `outputs` with logits; flushes.
    pub fn decode_end(&mut self, rows: u32, outputs: u32) -> Result<(), TraceError> {
        self.out.write_all(&[TAG_DECODE_END])?;
        self.out.write_all(&rows.to_le_bytes())?;
        self.out.write_all(&outputs.to_le_bytes())?;
        self.out.flush()?;
        Ok(())
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Reads a trace: the header, then records until the end.
pub struct TraceReader<R: Read> {
    input: R,
    header: TraceHeader,
    offset: u64,
    index: u64,
    /// (layer, ids) of the record just read when it was a demand (what a
    /// weights record must follow).
    last_demand: Option<(u32, u32)>,
}

impl<R: Read> TraceReader<R> {
    pub fn new(mut input: R) -> Result<Self, TraceError> {
        let mut offset = 0;
        let mut magic = [0u8; 8];
        read_exact(&mut input, &mut magic, &mut offset)?;
        if &magic != MAGIC {
            return Err(TraceError::BadMagic);
        }
        let n_expert = read_u32(&mut input, &mut offset)?;
        let k = read_u32(&mut input, &mut offset)?;
        let n_layers = read_u32(&mut input, &mut offset)?;
        let trunk_layers = read_u32(&mut input, &mut offset)?;
        if n_expert == 0 || n_expert > MAX_EXPERTS || k == 0 || n_layers > MAX_LAYERS {
            return Err(TraceError::Header(format!(
                "{n_expert} experts, k {k}, {n_layers} layers"
            )));
        }
        let slot_bytes = (0..n_layers)
            .map(|_| read_u64(&mut input, &mut offset))
            .collect::<Result<Vec<_>, _>>()?;
        let model_bytes = read_u64(&mut input, &mut offset)?;
        let mut len = [0u8; 2];
        read_exact(&mut input, &mut len, &mut offset)?;
        let mut name = vec![0u8; u16::from_le_bytes(len) as usize];
        read_exact(&mut input, &mut name, &mut offset)?;
        let header = TraceHeader {
            n_expert,
            k,
            trunk_layers,
            slot_bytes,
            model_bytes,
            model_name: String::from_utf8_lossy(&name).into_owned(),
        };
        header.check()?;
        Ok(Self {
            input,
            header,
            offset,
            index: 0,
            last_demand: None,
        })
    }

    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// The next record, or None at a clean end of the file.
    pub fn next_record(&mut self) -> Result<Option<TraceRecord>, TraceError> {
        let mut tag = [0u8; 1];
        if self.input.read(&mut tag)? == 0 {
            return Ok(None);
        }
        self.offset += 1;
        let index = self.index;
        self.index += 1;
        let corrupt = |what: String| TraceError::Corrupt { index, what };
        let after = self.last_demand.take();
        let record = match tag[0] {
            TAG_DEMAND => self.read_demand().map_err(|e| e.into_error(corrupt))?,
            TAG_DECODE_END => {
                let rows = read_u32(&mut self.input, &mut self.offset)?;
                let outputs = read_u32(&mut self.input, &mut self.offset)?;
                if outputs > rows {
                    return Err(corrupt(format!("{outputs} outputs of {rows} rows")));
                }
                TraceRecord::DecodeEnd { rows, outputs }
            }
            TAG_WEIGHTS => self
                .read_weights(after)
                .map_err(|e| e.into_error(corrupt))?,
            t => return Err(corrupt(format!("unknown tag {t}"))),
        };
        if let TraceRecord::Demand { layer, ids } = &record {
            self.last_demand = Some((*layer, ids.len() as u32));
        }
        Ok(Some(record))
    }

    /// A demand record's body (after its tag).
    fn read_demand(&mut self) -> Result<TraceRecord, BodyError> {
        let layer = read_u32(&mut self.input, &mut self.offset)?;
        let n = read_u32(&mut self.input, &mut self.offset)?;
        if layer as usize >= self.header.slot_bytes.len() {
            return Err(BodyError::Corrupt(format!(
                "layer {layer} beyond the header's layers"
            )));
        }
        if n == 0 || n % self.header.k != 0 {
            return Err(BodyError::Corrupt(format!(
                "{n} ids is not whole rows of {}",
                self.header.k
            )));
        }
        let mut raw = vec![0u8; n as usize * 2];
        read_exact(&mut self.input, &mut raw, &mut self.offset)?;
        let ids: Vec<u16> = raw
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        if let Some(bad) = ids.iter().find(|&&e| u32::from(e) >= self.header.n_expert) {
            return Err(BodyError::Corrupt(format!(
                "expert {bad} of {}",
                self.header.n_expert
            )));
        }
        Ok(TraceRecord::Demand { layer, ids })
    }

    /// A weights record's body: it must follow a demand of its layer and
    /// hold one finite weight per routed id.
    fn read_weights(&mut self, after: Option<(u32, u32)>) -> Result<TraceRecord, BodyError> {
        let layer = read_u32(&mut self.input, &mut self.offset)?;
        let n = read_u32(&mut self.input, &mut self.offset)?;
        if after != Some((layer, n)) {
            return Err(BodyError::Corrupt(format!(
                "weights of layer {layer} ({n}) not right after a demand of that layer with {n} ids"
            )));
        }
        let mut raw = vec![0u8; n as usize * 4];
        read_exact(&mut self.input, &mut raw, &mut self.offset)?;
        let weights: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if weights.iter().any(|w| !w.is_finite()) {
            return Err(BodyError::Corrupt("a weight is not finite".into()));
        }
        Ok(TraceRecord::Weights { layer, weights })
    }

    /// Every remaining record.
    pub fn records(mut self) -> Result<(TraceHeader, Vec<TraceRecord>), TraceError> {
        let mut out = Vec::new();
        while let Some(r) = self.next_record()? {
            out.push(r);
        }
        Ok((self.header, out))
    }
}

/// A record body's failure: the file's own error, or what is wrong with it
/// (named with the record's index by the caller).
enum BodyError {
    Trace(TraceError),
    Corrupt(String),
}

impl From<TraceError> for BodyError {
    fn from(e: TraceError) -> Self {
        Self::Trace(e)
    }
}

impl BodyError {
    fn into_error(self, corrupt: impl FnOnce(String) -> TraceError) -> TraceError {
        match self {
            Self::Trace(e) => e,
            Self::Corrupt(what) => corrupt(what),
        }
    }
}

fn read_exact<R: Read>(r: &mut R, buf: &mut [u8], offset: &mut u64) -> Result<(), TraceError> {
    match r.read_exact(buf) {
        Ok(()) => {
            *offset += buf.len() as u64;
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            Err(TraceError::Truncated { offset: *offset })
        }
        Err(e) => Err(e.into()),
    }
}

fn read_u32<R: Read>(r: &mut R, offset: &mut u64) -> Result<u32, TraceError> {
    let mut b = [0u8; 4];
    read_exact(r, &mut b, offset)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64<R: Read>(r: &mut R, offset: &mut u64) -> Result<u64, TraceError> {
    let mut b = [0u8; 8];
    read_exact(r, &mut b, offset)?;
    Ok(u64::from_le_bytes(b))
}

#[cfg(test)]
mod tests;
