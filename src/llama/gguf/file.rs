//! One gguf file read through ggml's own reader: its tensor table with
//! absolute file offsets and its metadata.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use crate::llama::error::LlamaError;
use crate::llama::quant::GgmlType;

const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// One tensor of a gguf file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub ggml_type: GgmlType,
    /// Element counts in ggml order (ne0 first); unused dims are 1.
    pub ne: [u64; 4],
    /// Absolute offset of the tensor's first byte in the file.
    pub file_offset: u64,
    pub size_bytes: u64,
}

impl TensorInfo {
    /// Bytes of one row (ne0 elements).
    pub(crate) fn row_bytes(&self) -> u64 {
        self.ggml_type.row_bytes(self.ne[0])
    }
    /// Bytes of one 2-D slice along dim 2 (one expert of a stacked expert tensor).
    /// Saturates on absurd shapes (the layout's check then refuses them).
    pub(crate) fn slice_bytes(&self) -> u64 {
        self.row_bytes().saturating_mul(self.ne[1])
    }
    /// The shape as a writer declares it: without trailing 1s (at least one dim).
    pub(crate) fn dims(&self) -> &[u64] {
        let n = self.ne.iter().rposition(|&x| x != 1).map_or(1, |i| i + 1);
        &self.ne[..n]
    }
}

/// A gguf metadata value, as far as bmoe needs to read them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MetaValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    IntArray(Vec<i64>),
    Other,
}

/// An open gguf file: header parsed by ggml, data not loaded.
pub struct GgufFile {
    path: PathBuf,
    ctx: NonNull<sys::gguf_context>,
    meta: *mut sys::ggml_context,
    file_bytes: u64,
    data_offset: u64,
    tensors: Vec<TensorInfo>,
}

impl GgufFile {
    /// Parse the header of `path`. Fails clearly for a missing file, a file that
    /// is not a gguf, and a header ggml cannot parse.
    pub fn open(path: &Path) -> Result<Self, LlamaError> {
        let io_err = |source| LlamaError::Io {
            path: path.to_path_buf(),
            source,
        };
        // A directory or a FIFO is refused before open (a FIFO would block in it).
        match std::fs::metadata(path) {
            Ok(m) if !m.is_file() => {
                let what = if m.is_dir() {
                    "a directory"
                } else {
                    "not a regular file"
                };
                return Err(io_err(std::io::Error::other(format!(
                    "it is {what}; give the model's .gguf file"
                ))));
            }
            _ => {}
        }
        let mut f = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(LlamaError::Missing {
                    path: path.to_path_buf(),
                })
            }
            Err(e) => return Err(io_err(e)),
        };
        let file_bytes = f.metadata().map_err(io_err)?.len();
        let mut magic = [0u8; 4];
        if file_bytes < 4 || f.read_exact(&mut magic).is_err() || &magic != GGUF_MAGIC {
            return Err(LlamaError::NotGguf {
                path: path.to_path_buf(),
            });
        }
        drop(f);
        // Our own bounded walk first: a few headers would abort inside ggml.
        crate::llama::header::check(path, file_bytes).map_err(|detail| LlamaError::Corrupt {
            path: path.to_path_buf(),
            detail,
        })?;
        crate::llama::backend::init_backend();
        let cpath = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| LlamaError::NulInPath(path.to_path_buf()))?;
        let mut meta: *mut sys::ggml_context = std::ptr::null_mut();
        let params = sys::gguf_init_params {
            no_alloc: true,
            ctx: &mut meta,
        };
        // `cpath` is NUL-terminated; `meta` is a valid out-pointer that
        // receives a no-alloc ggml context holding only tensor descriptors.
        // SAFETY: as the comment above says.
        let raw = unsafe { sys::gguf_init_from_file(cpath.as_ptr(), params) };
        let ctx = NonNull::new(raw).ok_or_else(|| LlamaError::Corrupt {
            path: path.to_path_buf(),
            detail: "ggml's gguf reader rejected the header (run with -v for its message)".into(),
        })?;
        let mut file = Self {
            path: path.to_path_buf(),
            ctx,
            meta,
            file_bytes,
            data_offset: 0,
            tensors: Vec::new(),
        };
        file.load_table()?;
        Ok(file)
    }

    fn load_table(&mut self) -> Result<(), LlamaError> {
        let ctx = self.ctx.as_ptr();
        // SAFETY: valid gguf context; pure getters.
        self.data_offset = unsafe { sys::gguf_get_data_offset(ctx) } as u64;
        // SAFETY: as above.
        let n = unsafe { sys::gguf_get_n_tensors(ctx) };
        for i in 0..n {
            // SAFETY: 0 <= i < n_tensors; the name is owned by the gguf context.
            let name = unsafe { CStr::from_ptr(sys::gguf_get_tensor_name(ctx, i)) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: as above.
            let (ty, off, size) = unsafe {
                (
                    sys::gguf_get_tensor_type(ctx, i),
                    sys::gguf_get_tensor_offset(ctx, i) as u64,
                    sys::gguf_get_tensor_size(ctx, i) as u64,
                )
            };
            let mut ne = [1u64; 4];
            if !self.meta.is_null() {
                let cname = CString::new(name.clone()).unwrap_or_default();
                // `meta` is the no-alloc context gguf_init filled with one
                // descriptor per tensor; the returned tensor is owned by it.
                // SAFETY: as the comment above says.
                let t = unsafe { sys::ggml_get_tensor(self.meta, cname.as_ptr()) };
                if !t.is_null() {
                    // SAFETY: non-null descriptor owned by `meta`.
                    ne = unsafe { (*t).ne }.map(|x| x.max(0) as u64);
                }
            }
            self.tensors.push(TensorInfo {
                name,
                ggml_type: GgmlType(ty),
                ne,
                file_offset: self.data_offset.saturating_add(off),
                size_bytes: size,
            });
        }
        Ok(())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub(crate) fn alignment(&self) -> u64 {
        // SAFETY: valid gguf context; pure getter.
        unsafe { sys::gguf_get_alignment(self.ctx.as_ptr()) as u64 }
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub(crate) fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Every tensor's bytes lie inside the file.
    pub(crate) fn check_complete(&self) -> Result<(), LlamaError> {
        let needed = self
            .tensors
            .iter()
            .map(|t| t.file_offset.saturating_add(t.size_bytes))
            .max()
            .unwrap_or(self.data_offset);
        if needed > self.file_bytes {
            return Err(LlamaError::Truncated {
                path: self.path.clone(),
                needed_bytes: needed,
                file_bytes: self.file_bytes,
            });
        }
        Ok(())
    }

    /// The vocabulary is one llama.cpp can build without asserting: no two
    /// tokens of `tokenizer.ggml.tokens` are the same string (llama.cpp maps
    /// strings to ids and aborts when the map and the list disagree in size;
    /// an empty token counts as `[EMPTY_i]`, as llama.cpp names it).
    pub(crate) fn check_vocab(&self) -> Result<(), LlamaError> {
        let Some(id) = self.key_id("tokenizer.ggml.tokens") else {
            return Ok(()); // llama.cpp refuses a missing vocabulary with an error
        };
        let ctx = self.ctx.as_ptr();
        // SAFETY: valid key id; type getters only.
        let is_strings = unsafe {
            sys::gguf_get_kv_type(ctx, id) == sys::GGUF_TYPE_ARRAY
                && sys::gguf_get_arr_type(ctx, id) == sys::GGUF_TYPE_STRING
        };
        if !is_strings {
            return Ok(()); // llama.cpp refuses the wrong type with an error
        }
        // SAFETY: valid key id of an array.
        let n = unsafe { sys::gguf_get_arr_n(ctx, id) };
        let mut seen = std::collections::HashMap::with_capacity(n);
        for i in 0..n {
            // SAFETY: i < n on a string array; the string is owned by the context.
            let bytes = unsafe { CStr::from_ptr(sys::gguf_get_arr_str(ctx, id, i)) }.to_bytes();
            let word = if bytes.is_empty() {
                format!("[EMPTY_{i}]").into_bytes()
            } else {
                bytes.to_vec()
            };
            if let Some(first) = seen.insert(word, i) {
                return Err(LlamaError::Corrupt {
                    path: self.path.clone(),
                    detail: format!(
                        "tokens {first} and {i} of tokenizer.ggml.tokens are the same string \
                         {:?}: the vocabulary is inconsistent",
                        String::from_utf8_lossy(bytes)
                    ),
                });
            }
        }
        Ok(())
    }

    /// A string array's values (a vocabulary's tokens), None when `key` is
    /// absent or not an array of strings.
    pub(crate) fn str_array(&self, key: &str) -> Option<Vec<String>> {
        let id = self.key_id(key)?;
        let ctx = self.ctx.as_ptr();
        // SAFETY: valid key id; type getters only.
        let is_strings = unsafe {
            sys::gguf_get_kv_type(ctx, id) == sys::GGUF_TYPE_ARRAY
                && sys::gguf_get_arr_type(ctx, id) == sys::GGUF_TYPE_STRING
        };
        if !is_strings {
            return None;
        }
        // SAFETY: valid key id of an array.
        let n = unsafe { sys::gguf_get_arr_n(ctx, id) };
        let words = (0..n)
            .map(|i| {
                // SAFETY: i < n on a string array; the string is owned by the context.
                unsafe { CStr::from_ptr(sys::gguf_get_arr_str(ctx, id, i)) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        Some(words)
    }

    fn key_id(&self, key: &str) -> Option<i64> {
        let ckey = CString::new(key).ok()?;
        // SAFETY: valid context and NUL-terminated key.
        let id = unsafe { sys::gguf_find_key(self.ctx.as_ptr(), ckey.as_ptr()) };
        (id >= 0).then_some(id)
    }

    /// Every metadata key, in file order.
    pub(crate) fn keys(&self) -> Vec<String> {
        // SAFETY: valid context; pure getter.
        let n = unsafe { sys::gguf_get_n_kv(self.ctx.as_ptr()) };
        (0..n)
            .map(|i| {
                // SAFETY: 0 <= i < n_kv; the key string is owned by the context.
                unsafe { CStr::from_ptr(sys::gguf_get_key(self.ctx.as_ptr(), i)) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }

    /// Read a metadata value.
    pub(crate) fn get(&self, key: &str) -> Option<MetaValue> {
        let id = self.key_id(key)?;
        let ctx = self.ctx.as_ptr();
        // `id` is a valid key id; each getter matches the key's type, as
        // gguf asserts (we dispatch on the reported type first).
        // SAFETY: as the comment above says.
        unsafe {
            let ty = sys::gguf_get_kv_type(ctx, id);
            Some(match ty {
                sys::GGUF_TYPE_UINT8 => MetaValue::Int(sys::gguf_get_val_u8(ctx, id) as i64),
                sys::GGUF_TYPE_INT8 => MetaValue::Int(sys::gguf_get_val_i8(ctx, id) as i64),
                sys::GGUF_TYPE_UINT16 => MetaValue::Int(sys::gguf_get_val_u16(ctx, id) as i64),
                sys::GGUF_TYPE_INT16 => MetaValue::Int(sys::gguf_get_val_i16(ctx, id) as i64),
                sys::GGUF_TYPE_UINT32 => MetaValue::Int(sys::gguf_get_val_u32(ctx, id) as i64),
                sys::GGUF_TYPE_INT32 => MetaValue::Int(sys::gguf_get_val_i32(ctx, id) as i64),
                sys::GGUF_TYPE_UINT64 => MetaValue::Int(sys::gguf_get_val_u64(ctx, id) as i64),
                sys::GGUF_TYPE_INT64 => MetaValue::Int(sys::gguf_get_val_i64(ctx, id)),
                sys::GGUF_TYPE_FLOAT32 => MetaValue::Float(sys::gguf_get_val_f32(ctx, id) as f64),
                sys::GGUF_TYPE_FLOAT64 => MetaValue::Float(sys::gguf_get_val_f64(ctx, id)),
                sys::GGUF_TYPE_BOOL => MetaValue::Bool(sys::gguf_get_val_bool(ctx, id)),
                sys::GGUF_TYPE_STRING => MetaValue::Str(
                    CStr::from_ptr(sys::gguf_get_val_str(ctx, id))
                        .to_string_lossy()
                        .into_owned(),
                ),
                sys::GGUF_TYPE_ARRAY => {
                    let at = sys::gguf_get_arr_type(ctx, id);
                    let n = sys::gguf_get_arr_n(ctx, id);
                    // gguf_get_arr_data asserts on string arrays: only ask for numbers.
                    let data = if at == sys::GGUF_TYPE_INT32 || at == sys::GGUF_TYPE_UINT32 {
                        sys::gguf_get_arr_data(ctx, id)
                    } else {
                        std::ptr::null()
                    };
                    match at {
                        _ if data.is_null() => MetaValue::Other,
                        sys::GGUF_TYPE_INT32 => MetaValue::IntArray(
                            std::slice::from_raw_parts(data as *const i32, n)
                                .iter()
                                .map(|&v| v as i64)
                                .collect(),
                        ),
                        sys::GGUF_TYPE_UINT32 => MetaValue::IntArray(
                            std::slice::from_raw_parts(data as *const u32, n)
                                .iter()
                                .map(|&v| v as i64)
                                .collect(),
                        ),
                        _ => MetaValue::Other,
                    }
                }
                _ => MetaValue::Other,
            })
        }
    }

    pub(crate) fn get_str(&self, key: &str) -> Option<String> {
        match self.get(key)? {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn get_int(&self, key: &str) -> Option<i64> {
        match self.get(key)? {
            MetaValue::Int(v) => Some(v),
            MetaValue::IntArray(v) => v.first().copied(),
            _ => None,
        }
    }

    /// `general.architecture`.
    pub(crate) fn arch(&self) -> Option<String> {
        self.get_str("general.architecture")
    }

    /// `{arch}.{suffix}` as an integer.
    pub(crate) fn arch_int(&self, suffix: &str) -> Option<i64> {
        self.get_int(&format!("{}.{suffix}", self.arch()?))
    }

    pub(crate) fn raw_ctx(&self) -> *const sys::gguf_context {
        self.ctx.as_ptr()
    }
}

impl Drop for GgufFile {
    fn drop(&mut self) {
        // SAFETY: both contexts were created by gguf_init_from_file and are freed once.
        unsafe {
            sys::gguf_free(self.ctx.as_ptr());
            if !self.meta.is_null() {
                sys::ggml_free(self.meta);
            }
        }
    }
}
