//! The streaming gguf writer used by the fixtures ([`GgufBuilder`]): metadata
//! and tensor descriptors through ggml's writer, tensor data streamed in order
//! into a file written whole or not at all, counted and hashed ([`Written`]).

use std::ffi::{c_char, c_void, CString};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use super::file::GgufFile;
use crate::llama::error::LlamaError;
use crate::llama::quant::GgmlType;

/// Builds a gguf file: metadata and tensor descriptors through ggml's writer,
/// tensor data streamed by the caller in order (so multi-GB files never sit in memory).
pub struct GgufBuilder {
    ctx: NonNull<sys::gguf_context>,
    scratch: NonNull<sys::ggml_context>,
    sizes: Vec<u64>,
    alignment: u32,
}

const MAX_TENSORS: usize = 8192;

impl GgufBuilder {
    /// An empty file whose tensors are aligned to `alignment` bytes (a power of two).
    pub fn new(alignment: u32) -> Result<Self, LlamaError> {
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(LlamaError::Gguf(format!(
                "alignment {alignment} is not a power of two"
            )));
        }
        crate::llama::backend::init_backend();
        // SAFETY: creates an empty gguf context; freed in Drop.
        let ctx = NonNull::new(unsafe { sys::gguf_init_empty() })
            .ok_or_else(|| LlamaError::Gguf("gguf_init_empty failed".into()))?;
        // SAFETY: pure size query.
        let overhead = unsafe { sys::ggml_tensor_overhead() };
        let params = sys::ggml_init_params {
            mem_size: MAX_TENSORS * overhead,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // SAFETY: a no-alloc context used only to build tensor descriptors.
        let scratch = NonNull::new(unsafe { sys::ggml_init(params) })
            .ok_or_else(|| LlamaError::Gguf("ggml_init failed".into()))?;
        let mut b = Self {
            ctx,
            scratch,
            sizes: Vec::new(),
            alignment,
        };
        b.set_u32("general.alignment", alignment)?;
        Ok(b)
    }

    fn key(key: &str) -> Result<CString, LlamaError> {
        CString::new(key).map_err(|_| LlamaError::Gguf(format!("bad key {key:?}")))
    }

    /// Copy every metadata key of `src` (tokenizer, template, ...).
    pub fn copy_metadata_from(&mut self, src: &GgufFile) -> Result<(), LlamaError> {
        if !self.sizes.is_empty() {
            return Err(LlamaError::Gguf(
                "copy metadata before adding tensors".into(),
            ));
        }
        // SAFETY: both contexts are valid; gguf_set_kv deep-copies the values.
        unsafe { sys::gguf_set_kv(self.ctx.as_ptr(), src.raw_ctx()) };
        // Keep our own alignment, not the source's.
        self.set_u32("general.alignment", self.alignment)?;
        Ok(())
    }

    pub(crate) fn remove_key(&mut self, key: &str) -> Result<(), LlamaError> {
        let k = Self::key(key)?;
        // SAFETY: valid context and key; removing an absent key is a no-op.
        unsafe { sys::gguf_remove_key(self.ctx.as_ptr(), k.as_ptr()) };
        Ok(())
    }

    pub fn set_u32(&mut self, key: &str, v: u32) -> Result<(), LlamaError> {
        let k = Self::key(key)?;
        if key == "general.alignment" {
            if v == 0 || !v.is_power_of_two() || !self.sizes.is_empty() {
                return Err(LlamaError::Gguf(format!(
                    "general.alignment {v}: must be a power of two, set before tensors"
                )));
            }
            self.alignment = v;
        }
        // SAFETY: valid context and key; value copied.
        unsafe { sys::gguf_set_val_u32(self.ctx.as_ptr(), k.as_ptr(), v) };
        Ok(())
    }

    pub(crate) fn set_u16(&mut self, key: &str, v: u16) -> Result<(), LlamaError> {
        let k = Self::key(key)?;
        // SAFETY: valid context and key; value copied.
        unsafe { sys::gguf_set_val_u16(self.ctx.as_ptr(), k.as_ptr(), v) };
        Ok(())
    }

    pub(crate) fn set_i32(&mut self, key: &str, v: i32) -> Result<(), LlamaError> {
        let k = Self::key(key)?;
        // SAFETY: valid context and key; value copied.
        unsafe { sys::gguf_set_val_i32(self.ctx.as_ptr(), k.as_ptr(), v) };
        Ok(())
    }

    pub(crate) fn set_f32(&mut self, key: &str, v: f32) -> Result<(), LlamaError> {
        let k = Self::key(key)?;
        // SAFETY: valid context and key; value copied.
        unsafe { sys::gguf_set_val_f32(self.ctx.as_ptr(), k.as_ptr(), v) };
        Ok(())
    }

    pub(crate) fn set_bool(&mut self, key: &str, v: bool) -> Result<(), LlamaError> {
        let k = Self::key(key)?;
        // SAFETY: valid context and key; value copied.
        unsafe { sys::gguf_set_val_bool(self.ctx.as_ptr(), k.as_ptr(), v) };
        Ok(())
    }

    pub(crate) fn set_str(&mut self, key: &str, v: &str) -> Result<(), LlamaError> {
        let k = Self::key(key)?;
        let cv = CString::new(v).map_err(|_| LlamaError::Gguf("NUL in string value".into()))?;
        // SAFETY: valid context, key and value; the string is copied.
        unsafe { sys::gguf_set_val_str(self.ctx.as_ptr(), k.as_ptr(), cv.as_ptr()) };
        Ok(())
    }

    pub(crate) fn set_i32_array(&mut self, key: &str, v: &[i32]) -> Result<(), LlamaError> {
        let k = Self::key(key)?;
        // SAFETY: `v` is valid for `v.len()` i32 values; gguf copies them.
        unsafe {
            sys::gguf_set_arr_data(
                self.ctx.as_ptr(),
                k.as_ptr(),
                sys::GGUF_TYPE_INT32,
                v.as_ptr() as *const c_void,
                v.len(),
            )
        };
        Ok(())
    }

    /// A string array (a vocabulary's tokens).
    pub(crate) fn set_str_array(&mut self, key: &str, v: &[String]) -> Result<(), LlamaError> {
        let k = Self::key(key)?;
        let owned: Vec<CString> = v
            .iter()
            .map(|s| CString::new(s.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| LlamaError::Gguf(format!("NUL in a string of {key}")))?;
        let mut ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        // SAFETY: `ptrs` holds `ptrs.len()` NUL-terminated strings that `owned`
        // keeps alive for the call; gguf copies each one.
        unsafe {
            sys::gguf_set_arr_str(self.ctx.as_ptr(), k.as_ptr(), ptrs.as_mut_ptr(), ptrs.len())
        };
        Ok(())
    }

    /// The bytes [`Self::write`] will write: the header, then each tensor
    /// padded to the alignment.
    pub(crate) fn file_bytes(&self) -> u64 {
        // SAFETY: valid context; pure size query.
        let meta = unsafe { sys::gguf_get_meta_size(self.ctx.as_ptr()) } as u64;
        let align = u64::from(self.alignment);
        meta + self
            .sizes
            .iter()
            .map(|s| s.div_ceil(align) * align)
            .sum::<u64>()
    }

    /// ggml's writer lays tensors out with the context's internal alignment, which
    /// only its reader sets (from `general.alignment`). Round-trip the metadata
    /// through the reader once, before the first tensor, so offsets, padding and
    /// the key agree.
    fn adopt_alignment(&mut self) -> Result<(), LlamaError> {
        // SAFETY: valid context; pure size query.
        let size = unsafe { sys::gguf_get_meta_size(self.ctx.as_ptr()) };
        let mut meta = vec![0u8; size];
        // SAFETY: `meta` is writable for exactly `size` bytes.
        unsafe { sys::gguf_get_meta_data(self.ctx.as_ptr(), meta.as_mut_ptr() as *mut c_void) };
        let params = sys::gguf_init_params {
            no_alloc: true,
            ctx: std::ptr::null_mut(),
        };
        // `meta` is a complete gguf header with no tensors, valid for the call;
        // the parsed context copies what it needs.
        // SAFETY: as the comment above says.
        let parsed = unsafe {
            sys::gguf_init_from_buffer(meta.as_ptr() as *const c_void, meta.len(), params)
        };
        let parsed = NonNull::new(parsed).ok_or_else(|| {
            LlamaError::Gguf("could not re-read the metadata just written".into())
        })?;
        // SAFETY: the old context is ours and no longer referenced once replaced.
        unsafe { sys::gguf_free(self.ctx.as_ptr()) };
        self.ctx = parsed;
        // SAFETY: valid context; pure getter.
        let got = unsafe { sys::gguf_get_alignment(self.ctx.as_ptr()) } as u32;
        if got != self.alignment {
            return Err(LlamaError::Gguf(format!(
                "alignment {got} after re-read, wanted {}",
                self.alignment
            )));
        }
        Ok(())
    }

    /// Declare the next tensor (data must later be written in declaration order).
    pub fn add_tensor(&mut self, name: &str, ty: GgmlType, ne: &[u64]) -> Result<(), LlamaError> {
        if ne.is_empty() || ne.len() > 4 {
            return Err(LlamaError::Gguf(format!("{name}: {} dims", ne.len())));
        }
        if name.len() >= 64 {
            return Err(LlamaError::Gguf(format!("tensor name too long: {name}")));
        }
        if ne[0] % ty.block_size() != 0 {
            return Err(LlamaError::Gguf(format!(
                "{name}: ne0 {} not a multiple of {}'s block size",
                ne[0],
                ty.name()
            )));
        }
        if self.sizes.is_empty() {
            self.adopt_alignment()?;
        }
        if self.sizes.len() >= MAX_TENSORS {
            return Err(LlamaError::Gguf("too many tensors".into()));
        }
        let cname = CString::new(name).map_err(|_| LlamaError::Gguf("NUL in name".into()))?;
        let ne_i: Vec<i64> = ne.iter().map(|&x| x as i64).collect();
        // `scratch` is a no-alloc context with room for MAX_TENSORS
        // descriptors (checked above); `ne_i` holds `ne.len()` dims; gguf_add_tensor
        // copies the descriptor (name, type, shape) by value; the name fits (< 64).
        // SAFETY: as the comment above says.
        unsafe {
            let cname_exists = sys::gguf_find_tensor(self.ctx.as_ptr(), cname.as_ptr());
            if cname_exists >= 0 {
                return Err(LlamaError::Gguf(format!("duplicate tensor {name}")));
            }
            let t = sys::ggml_new_tensor(
                self.scratch.as_ptr(),
                ty.0,
                ne_i.len() as i32,
                ne_i.as_ptr(),
            );
            if t.is_null() {
                return Err(LlamaError::Gguf("ggml_new_tensor failed".into()));
            }
            sys::ggml_set_name(t, cname.as_ptr() as *const c_char);
            sys::gguf_add_tensor(self.ctx.as_ptr(), t);
        }
        let rows: u64 = ne[1..].iter().product();
        self.sizes.push(ty.row_bytes(ne[0]) * rows);
        Ok(())
    }

    /// Write the file: header, then each tensor's bytes from `fill(i, buf)` in
    /// declaration order, padded to the alignment. `fill` must produce exactly
    /// the declared size. Written to a temporary name of this process beside
    /// `path` (removed on any failure), synced, then renamed: a reader never
    /// sees a partial file and two writers never share one. A `path` that is a
    /// directory is refused before anything is built.
    pub fn write<F>(&self, path: &Path, mut fill: F) -> Result<Written, LlamaError>
    where
        F: FnMut(usize, &mut Vec<u8>) -> Result<(), LlamaError>,
    {
        let io_err = |source| LlamaError::Io {
            path: path.to_path_buf(),
            source,
        };
        // SAFETY: valid context; pure size query.
        let meta_size = unsafe { sys::gguf_get_meta_size(self.ctx.as_ptr()) };
        let mut meta = vec![0u8; meta_size];
        // SAFETY: `meta` is writable for exactly gguf_get_meta_size bytes.
        unsafe { sys::gguf_get_meta_data(self.ctx.as_ptr(), meta.as_mut_ptr() as *mut c_void) };
        // Removed on any failure (and by a signal's hard exit), never half-renamed.
        let (file, pending) =
            bmoe_output::PendingFile::create_whole_or_nothing(path).map_err(io_err)?;
        let mut w = HashingWriter::new(BufWriter::with_capacity(8 << 20, file));
        w.write_all(&meta).map_err(io_err)?;
        let align = self.alignment as u64;
        let mut buf = Vec::new();
        let zeros = vec![0u8; align as usize];
        for (i, &size) in self.sizes.iter().enumerate() {
            buf.clear();
            fill(i, &mut buf)?;
            if buf.len() as u64 != size {
                return Err(LlamaError::Gguf(format!(
                    "tensor {i}: filled {} bytes, declared {size}",
                    buf.len()
                )));
            }
            w.write_all(&buf).map_err(io_err)?;
            let pad = (align - (w.bytes - meta_size as u64) % align) % align;
            w.write_all(&zeros[..pad as usize]).map_err(io_err)?;
        }
        let written = w.finish().map_err(io_err)?;
        pending.commit().map_err(io_err)?;
        Ok(written)
    }
}

/// What [`GgufBuilder::write`] wrote: the file's size and sha256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub(crate) bytes: u64,
    pub(crate) sha256: String,
}

/// A writer that hashes and counts what goes through it.
struct HashingWriter {
    inner: BufWriter<File>,
    hash: sha2::Sha256,
    bytes: u64,
}

impl HashingWriter {
    fn new(inner: BufWriter<File>) -> Self {
        use sha2::Digest as _;
        Self {
            inner,
            hash: sha2::Sha256::new(),
            bytes: 0,
        }
    }

    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        use sha2::Digest as _;
        self.inner.write_all(b)?;
        self.hash.update(b);
        self.bytes += b.len() as u64;
        Ok(())
    }

    /// Flush and sync the file; its size and hash.
    fn finish(self) -> std::io::Result<Written> {
        use sha2::Digest as _;
        self.inner
            .into_inner()
            .map_err(|e| e.into_error())?
            .sync_all()?;
        Ok(Written {
            bytes: self.bytes,
            sha256: hex(&self.hash.finalize()),
        })
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Drop for GgufBuilder {
    fn drop(&mut self) {
        // SAFETY: created in `new`, freed once.
        unsafe {
            sys::gguf_free(self.ctx.as_ptr());
            sys::ggml_free(self.scratch.as_ptr());
        }
    }
}
