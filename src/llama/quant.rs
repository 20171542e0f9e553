//! ggml tensor types and the quantize / dequantize kernels (used by the fixtures).

use std::ffi::{c_void, CStr};

use llama_cpp_sys_2 as sys;

use super::LlamaError;

/// A ggml tensor type (`enum ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub sys::ggml_type);

impl GgmlType {
    pub const F32: GgmlType = GgmlType(sys::GGML_TYPE_F32);
    pub const F16: GgmlType = GgmlType(sys::GGML_TYPE_F16);
    pub const Q4_1: GgmlType = GgmlType(sys::GGML_TYPE_Q4_1);
    pub const Q8_0: GgmlType = GgmlType(sys::GGML_TYPE_Q8_0);

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
    pub fn block_size(self) -> u64 {
        self.traits()
            .map(|t| t.blck_size.max(1) as u64)
            .unwrap_or(1)
    }

    /// Bytes of a row of `ne0` elements.
    pub fn row_bytes(self, ne0: u64) -> u64 {
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

    pub fn is_quantized(self) -> bool {
        self.traits().map(|t| t.is_quantized).unwrap_or(false)
    }
}

/// Convert `n` elements of type `ty` stored in `src` to f32.
pub fn dequantize(ty: GgmlType, src: &[u8], n: u64) -> Result<Vec<f32>, LlamaError> {
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
    // SAFETY: `src` holds at least row_bytes(n) bytes of `ty` data (checked), and
    // `out` has room for `n` floats; n is a multiple of the block size.
    unsafe { to_float(src.as_ptr() as *const c_void, out.as_mut_ptr(), n as i64) };
    Ok(out)
}

/// Quantize `src` (rows of `n_per_row` f32 values) to `ty`, appending to `out`.
pub fn quantize(
    ty: GgmlType,
    src: &[f32],
    n_per_row: u64,
    out: &mut Vec<u8>,
) -> Result<(), LlamaError> {
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
    // SAFETY: only asks whether the type needs an importance matrix.
    if unsafe { sys::ggml_quantize_requires_imatrix(ty.0) } {
        return Err(LlamaError::Quant(format!(
            "{} needs an importance matrix",
            ty.name()
        )));
    }
    let start = out.len();
    out.resize(start + bytes, 0);
    // SAFETY: `src` holds nrows * n_per_row floats; the destination has exactly
    // row_bytes(n_per_row) * nrows writable bytes; no imatrix (null) is allowed
    // for this type (checked above). ggml_quantize_chunk initialises its tables itself.
    let written = unsafe {
        sys::ggml_quantize_chunk(
            ty.0,
            src.as_ptr(),
            out[start..].as_mut_ptr() as *mut c_void,
            0,
            nrows as i64,
            n_per_row as i64,
            std::ptr::null(),
        )
    };
    if written != bytes {
        return Err(LlamaError::Quant(format!(
            "wrote {written} of {bytes} bytes"
        )));
    }
    Ok(())
}
