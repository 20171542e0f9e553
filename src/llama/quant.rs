//! ggml tensor types and the quantize / dequantize kernels (used by the fixtures).

use std::ffi::{c_void, CStr};

use llama_cpp_sys_2 as sys;

use super::error::LlamaError;

/// A ggml tensor type (`enum ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub sys::ggml_type);

impl GgmlType {
    pub(crate) const F32: GgmlType = GgmlType(sys::GGML_TYPE_F32);
    pub(crate) const I32: GgmlType = GgmlType(sys::GGML_TYPE_I32);
    pub(crate) const Q8_0: GgmlType = GgmlType(sys::GGML_TYPE_Q8_0);
    pub(crate) const Q4_K: GgmlType = GgmlType(sys::GGML_TYPE_Q4_K);
    pub(crate) const Q6_K: GgmlType = GgmlType(sys::GGML_TYPE_Q6_K);
    pub(crate) const F16: GgmlType = GgmlType(sys::GGML_TYPE_F16);
    pub(crate) const Q5_0: GgmlType = GgmlType(sys::GGML_TYPE_Q5_0);
    pub(crate) const Q5_1: GgmlType = GgmlType(sys::GGML_TYPE_Q5_1);
    pub(crate) const Q5_K: GgmlType = GgmlType(sys::GGML_TYPE_Q5_K);
    pub(crate) const MXFP4: GgmlType = GgmlType(sys::GGML_TYPE_MXFP4);

    /// The types `ggml_quantize_chunk` converts f32 to (the others, such as
    /// q8_1, q8_K or the integer types, are only computed inside ggml).
    const WRITABLE: [sys::ggml_type; 28] = [
        sys::GGML_TYPE_F32,
        sys::GGML_TYPE_F16,
        sys::GGML_TYPE_BF16,
        sys::GGML_TYPE_Q1_0,
        sys::GGML_TYPE_Q2_0,
        sys::GGML_TYPE_Q4_0,
        sys::GGML_TYPE_Q4_1,
        sys::GGML_TYPE_Q5_0,
        sys::GGML_TYPE_Q5_1,
        sys::GGML_TYPE_Q8_0,
        sys::GGML_TYPE_MXFP4,
        sys::GGML_TYPE_NVFP4,
        sys::GGML_TYPE_Q2_K,
        sys::GGML_TYPE_Q3_K,
        sys::GGML_TYPE_Q4_K,
        sys::GGML_TYPE_Q5_K,
        sys::GGML_TYPE_Q6_K,
        sys::GGML_TYPE_TQ1_0,
        sys::GGML_TYPE_TQ2_0,
        sys::GGML_TYPE_IQ2_XXS,
        sys::GGML_TYPE_IQ2_XS,
        sys::GGML_TYPE_IQ2_S,
        sys::GGML_TYPE_IQ3_XXS,
        sys::GGML_TYPE_IQ3_S,
        sys::GGML_TYPE_IQ1_S,
        sys::GGML_TYPE_IQ1_M,
        sys::GGML_TYPE_IQ4_NL,
        sys::GGML_TYPE_IQ4_XS,
    ];

    pub fn name(self) -> String {
        // SAFETY: returns a static string for any type id (or "NONE").
        let p = unsafe { sys::ggml_type_name(self.0) };
        if p.is_null() {
            return format!("type{}", self.0);
        }
        // SAFETY: non-null static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn traits(self) -> Option<&'static sys::ggml_type_traits> {
        if self.0 >= sys::GGML_TYPE_COUNT {
            return None;
        }
        // SAFETY: in-range type id; the traits table is static.
        let p = unsafe { sys::ggml_get_type_traits(self.0) };
        // SAFETY: non-null pointers into a static table.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Elements per quantization block (1 for float types).
    pub(crate) fn block_size(self) -> u64 {
        self.traits()
            .map(|t| t.blck_size.max(1) as u64)
            .unwrap_or(1)
    }

    /// Bytes of a row of `ne0` elements.
    pub(crate) fn row_bytes(self, ne0: u64) -> u64 {
        if self.traits().is_none() {
            return 0;
        }
        // SAFETY: valid type id; pure arithmetic.
        unsafe { sys::ggml_row_size(self.0, ne0 as i64) as u64 }
    }

    /// The type named `name` as ggml names it (`q8_0`, `mxfp4`, ...; any case).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        (0..sys::GGML_TYPE_COUNT)
            .map(GgmlType)
            .filter(|t| t.traits().is_some_and(|tr| tr.blck_size > 0))
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Whether [`quantize`] can write this type.
    pub fn is_writable(self) -> bool {
        Self::WRITABLE.contains(&self.0)
    }
}

/// Convert `n` elements of type `ty` stored in `src` to f32.
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], n: u64) -> Result<Vec<f32>, LlamaError> {
    let need = ty.row_bytes(n);
    if (src.len() as u64) < need || n % ty.block_size() != 0 {
        return Err(LlamaError::Quant(format!(
            "{}: {} bytes cannot hold {n} elements",
            ty.name(),
            src.len()
        )));
    }
    let mut out = vec![0f32; n as usize];
    if ty == GgmlType::F32 {
        for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        return Ok(out);
    }
    let to_float = ty
        .traits()
        .and_then(|t| t.to_float)
        .ok_or_else(|| LlamaError::Quant(format!("{} has no to_float", ty.name())))?;
    // `src` holds at least row_bytes(n) bytes of `ty` data (checked), and
    // `out` has room for `n` floats; n is a multiple of the block size.
    // SAFETY: as the comment above says.
    unsafe { to_float(src.as_ptr() as *const c_void, out.as_mut_ptr(), n as i64) };
    Ok(out)
}

/// Quantize `src` (rows of `n_per_row` f32 values) to `ty`, appending to `out`.
pub(crate) fn quantize(
    ty: GgmlType,
    src: &[f32],
    n_per_row: u64,
    out: &mut Vec<u8>,
) -> Result<(), LlamaError> {
    if !ty.is_writable() {
        return Err(LlamaError::Quant(format!(
            "ggml does not write {} tensors",
            ty.name()
        )));
    }
    if n_per_row == 0 || src.len() as u64 % n_per_row != 0 || n_per_row % ty.block_size() != 0 {
        return Err(LlamaError::Quant(format!(
            "{}: {} values are not whole rows of {n_per_row}",
            ty.name(),
            src.len()
        )));
    }
    let nrows = src.len() as u64 / n_per_row;
    let bytes = (ty.row_bytes(n_per_row) * nrows) as usize;
    if ty == GgmlType::F32 {
        out.extend(src.iter().flat_map(|v| v.to_le_bytes()));
        return Ok(());
    }
    let imatrix = uniform_imatrix(ty, n_per_row);
    let start = out.len();
    out.resize(start + bytes, 0);
    // `ty` is a type ggml_quantize_chunk converts to (checked above), which
    // initialises its tables itself. The importance matrix is null or
    // n_per_row floats (ggml reads one weight per column, the same for every
    // row), and non-null for the types that require one.
    // SAFETY: `src` is nrows * n_per_row floats; the destination, exactly `bytes` writable bytes.
    let written = unsafe {
        sys::ggml_quantize_chunk(
            ty.0,
            src.as_ptr(),
            out[start..].as_mut_ptr() as *mut c_void,
            0,
            nrows as i64,
            n_per_row as i64,
            imatrix.as_ref().map_or(std::ptr::null(), |m| m.as_ptr()),
        )
    };
    if written != bytes {
        return Err(LlamaError::Quant(format!(
            "wrote {written} of {bytes} bytes"
        )));
    }
    Ok(())
}

/// For the types ggml cannot quantize without an importance matrix (iq2_xxs,
/// iq2_xs, iq1_s): a uniform one, every column weighted 1; None for the rest,
/// which then quantize as llama-quantize does without `--imatrix`.
fn uniform_imatrix(ty: GgmlType, n_per_row: u64) -> Option<Vec<f32>> {
    // SAFETY: only asks whether the type needs an importance matrix.
    let needed = unsafe { sys::ggml_quantize_requires_imatrix(ty.0) };
    needed.then(|| vec![1.0; n_per_row as usize])
}
