//! A loaded llama.cpp model: metadata, vocabulary, tokenizer and chat template.

use std::ffi::{c_char, CString};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use llama_cpp_sys_2 as sys;

use super::gguf::GgufShards;
use super::{init_backend, LlamaError, Token};

/// How to load a model.
#[derive(Debug, Clone)]
pub struct ModelParams {
    /// Map the file (llama.cpp's default) instead of reading it into anonymous buffers.
    pub use_mmap: bool,
    /// Load the MTP (nextn) block(s) so that an MTP context can be created.
    pub load_mtp: bool,
    /// Integer metadata overrides (key, value), e.g. `llama.expert_used_count`.
    pub int_overrides: Vec<(String, i64)>,
    /// Map these files (a streamed model's) without reading them in: the
    /// caller reads what it needs (see [`super::populate`]).
    pub unpopulated: Vec<std::path::PathBuf>,
}

impl Default for ModelParams {
    fn default() -> Self {
        Self {
            use_mmap: true,
            load_mtp: false,
            int_overrides: Vec::new(),
            unpopulated: Vec::new(),
        }
    }
}

/// Load progress on stderr, once a load has taken longer than [`Self::QUIET`]:
/// one line updated in place at most every half second.
pub struct LoadProgress {
    label: String,
    started: Instant,
    last: Option<Instant>,
}

impl LoadProgress {
    /// Loads shorter than this print nothing.
    const QUIET: Duration = Duration::from_millis(1500);

    pub fn new(label: String, started: Instant) -> Self {
        Self {
            label,
            started,
            last: None,
        }
    }

    /// What to print for `frac` (0..=1) done at `now`, if anything.
    pub fn update(&mut self, frac: f32, now: Instant) -> Option<String> {
        let since = now.saturating_duration_since(self.started);
        let due = match self.last {
            None => true,
            // The end is always shown once something was.
            Some(_) if frac >= 1.0 => true,
            Some(t) => now.saturating_duration_since(t) >= Duration::from_millis(500),
        };
        if since < Self::QUIET || !due {
            return None;
        }
        self.last = Some(now);
        let pct = (frac.clamp(0.0, 1.0) * 100.0) as u32;
        Some(format!(
            "\r{}: {pct:3}% ({:.1} s)",
            self.label,
            since.as_secs_f64()
        ))
    }

    /// Whether a line was printed (it needs its newline).
    pub fn shown(&self) -> bool {
        self.last.is_some()
    }
}

/// llama.cpp's load progress callback: prints the progress (see
/// [`LoadProgress`]); returning false cancels the load (on a signal).
extern "C" fn load_progress(progress: f32, data: *mut std::ffi::c_void) -> bool {
    // `data` is the `LoadProgress` that `Model::load` keeps alive and
    // does not touch while llama_model_load_from_file (which calls this on
    // the loading thread) runs.
    // SAFETY: as the comment above says.
    let p = unsafe { &mut *(data as *mut LoadProgress) };
    if let Some(line) = p.update(progress, Instant::now()) {
        let mut e = std::io::stderr().lock();
        let _ = e.write_all(line.as_bytes());
        let _ = e.flush();
    }
    crate::interrupt::requested().is_none()
}

/// llama.cpp's override array: the entries, then one with an empty key.
fn kv_overrides(ints: &[(String, i64)]) -> Result<Vec<sys::llama_model_kv_override>, LlamaError> {
    let mut v = Vec::with_capacity(ints.len() + 1);
    for (k, val) in ints {
        // SAFETY: an all-zero override is a valid value (tag INT, empty key, 0).
        let mut o: sys::llama_model_kv_override = unsafe { std::mem::zeroed() };
        if k.len() >= o.key.len() || k.contains('\0') {
            return Err(LlamaError::Gguf(format!(
                "invalid metadata override key {k:?}"
            )));
        }
        for (d, b) in o.key.iter_mut().zip(k.bytes()) {
            *d = b as std::os::raw::c_char;
        }
        o.tag = sys::LLAMA_KV_OVERRIDE_TYPE_INT;
        o.__bindgen_anon_1.val_i64 = *val;
        v.push(o);
    }
    // SAFETY: as above; the empty key terminates the array.
    v.push(unsafe { std::mem::zeroed() });
    Ok(v)
}

/// One message of a chat, for [`Model::apply_chat_template`].
#[derive(Debug, Clone)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// A llama.cpp model, shared (`Arc`) by the contexts on it, which may live on
/// different threads (the target on the verify thread, the MTP head on the
/// draft actor's).
///
/// The one thing about a model that is written after load is its weight
/// tensors' data pointers: eval hooks point expert tensors at the flash
/// actor's arena and, with `--dense-weights anon`, dense tensors at anonymous
/// copies, from inside a decode (the eval callback). The tensors are the
/// model's, seen by every context on it. So decodes of one model take turns:
/// [`Context::decode`](super::Context::decode) holds the model's decode turn
/// ([`Model::decode_turn`]) for the whole `llama_decode`, and a second decode
/// of the same model while one runs is refused with an error (never waited
/// for: the contexts' owners hand the turn over by their own protocol, as the
/// verify loop and the draft actor do with their blocking request/reply). A
/// data pointer is therefore never rewritten while another decode reads it.
pub struct Model {
    ptr: NonNull<sys::llama_model>,
    path: PathBuf,
    /// Whether a decode of a context on this model is running.
    decoding: AtomicBool,
    /// Whether its MTP (nextn) blocks were loaded ([`ModelParams::load_mtp`]).
    mtp_loaded: bool,
}

// SAFETY: after load, llama.cpp only reads a llama_model, except the tensor
// data pointers that eval hooks rewrite inside a decode, which holds the decode
// turn (see the type's docs): so moving the model between threads is sound.
unsafe impl Send for Model {}
// SAFETY: every `&self` method only reads the model; concurrent decodes of its
// contexts, the only writers of shared state (tensor data pointers), are
// refused by the decode turn (a compare-exchange, checked in Context::decode).
unsafe impl Sync for Model {}

/// A decode of a context on the model is running; dropped when it returns.
pub struct DecodeTurn<'a>(&'a AtomicBool);

impl Drop for DecodeTurn<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Model {
    /// Take the model's decode turn, or fail when another context on the model
    /// is decoding right now (see the type's docs).
    pub fn decode_turn(&self) -> Result<DecodeTurn<'_>, LlamaError> {
        self.decoding
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .map_err(|_| LlamaError::ConcurrentDecode)?;
        Ok(DecodeTurn(&self.decoding))
    }

    /// Validate the file as a gguf (clear errors for missing, non-gguf and
    /// truncated files; for a split model, every shard), then load it with
    /// llama.cpp on the CPU (which finds the other shards itself). Weight
    /// repacking is always off so that file offsets describe what the matmuls read.
    pub fn load(path: &Path, params: &ModelParams) -> Result<Self, LlamaError> {
        drop(GgufShards::open(path)?);
        init_backend();
        let cpath = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| LlamaError::NulInPath(path.to_path_buf()))?;
        // SAFETY: returns a plain struct by value; no pointers are retained.
        let mut mp = unsafe { sys::llama_model_default_params() };
        mp.n_gpu_layers = 0;
        mp.use_extra_bufts = false;
        mp.load_mtp = params.load_mtp;
        mp.load_mode = if params.use_mmap {
            sys::LLAMA_LOAD_MODE_MMAP
        } else {
            sys::LLAMA_LOAD_MODE_NONE
        };
        mp.lazy_mode = sys::LLAMA_LAZY_MODE_OFF;
        // A signal stops the load at llama.cpp's next progress report.
        let mut progress = LoadProgress::new(format!("load {}", path.display()), Instant::now());
        mp.progress_callback = Some(load_progress);
        mp.progress_callback_user_data =
            &mut progress as *mut LoadProgress as *mut std::ffi::c_void;
        let overrides = kv_overrides(&params.int_overrides)?;
        if !params.int_overrides.is_empty() {
            mp.kv_overrides = overrides.as_ptr();
        }
        let unpopulated: Vec<&Path> = params.unpopulated.iter().map(|p| p.as_path()).collect();
        let armed = (!unpopulated.is_empty()).then(|| super::populate::Armed::new(&unpopulated));
        // `cpath` is a valid NUL-terminated string for the call; `mp` is a
        // fully initialised parameter struct whose pointers (path, overrides
        // terminated by an empty key, the progress state) stay valid for the
        // whole call.
        // SAFETY: as the comment above says.
        let raw = unsafe { sys::llama_model_load_from_file(cpath.as_ptr(), mp) };
        drop(armed);
        if progress.shown() {
            let _ = writeln!(std::io::stderr());
        }
        let ptr = NonNull::new(raw).ok_or_else(|| match crate::interrupt::requested() {
            Some(_) => LlamaError::Interrupted,
            None => LlamaError::LoadFailed {
                path: path.to_path_buf(),
            },
        })?;
        Ok(Self {
            ptr,
            path: path.to_path_buf(),
            decoding: AtomicBool::new(false),
            mtp_loaded: params.load_mtp,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::llama_model {
        self.ptr.as_ptr()
    }

    fn vocab(&self) -> *const sys::llama_vocab {
        // The model pointer is valid for `self`'s lifetime; the vocab it
        // returns is owned by the model and lives as long.
        // SAFETY: as the comment above says.
        unsafe { sys::llama_model_get_vocab(self.ptr.as_ptr()) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Trunk layers (excluding nextn/MTP blocks).
    pub fn n_layer(&self) -> u32 {
        // SAFETY: valid model pointer; pure getter.
        unsafe { sys::llama_model_n_layer(self.ptr.as_ptr()) }.max(0) as u32
    }

    /// Whether the MTP (nextn) blocks were loaded, so that an MTP context
    /// can be created on it.
    pub fn mtp_loaded(&self) -> bool {
        self.mtp_loaded
    }

    /// MTP (nextn) blocks loaded after the trunk.
    pub fn n_layer_nextn(&self) -> u32 {
        // SAFETY: valid model pointer; pure getter.
        unsafe { sys::llama_model_n_layer_nextn(self.ptr.as_ptr()) }.max(0) as u32
    }

    pub fn n_embd(&self) -> u32 {
        // SAFETY: valid model pointer; pure getter.
        unsafe { sys::llama_model_n_embd(self.ptr.as_ptr()) }.max(0) as u32
    }

    /// Attention heads (of the first layer).
    pub fn n_head(&self) -> u32 {
        // SAFETY: valid model pointer; pure getter.
        unsafe { sys::llama_model_n_head(self.ptr.as_ptr()) }.max(0) as u32
    }

    pub fn n_vocab(&self) -> usize {
        // SAFETY: valid vocab pointer owned by the model; pure getter.
        unsafe { sys::llama_vocab_n_tokens(self.vocab()) }.max(0) as usize
    }

    /// Trained context length.
    pub fn n_ctx_train(&self) -> u32 {
        // SAFETY: valid model pointer; pure getter.
        unsafe { sys::llama_model_n_ctx_train(self.ptr.as_ptr()) }.max(0) as u32
    }

    /// llama.cpp's one-line description (arch, size, quant).
    pub fn description(&self) -> String {
        let mut buf = vec![0u8; 256];
        // `buf` is writable for `buf.len()` bytes; llama.cpp writes at most
        // that many including the NUL terminator.
        // SAFETY: as the comment above says.
        let n = unsafe {
            sys::llama_model_desc(
                self.ptr.as_ptr(),
                buf.as_mut_ptr() as *mut c_char,
                buf.len(),
            )
        };
        buf.truncate(n.clamp(0, 255) as usize);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// End-of-generation token (EOS, EOT, `<|im_end|>`, ...).
    pub fn is_eog(&self, token: Token) -> bool {
        // Valid vocab pointer; any token id is accepted (out of range -> false/abort
        // is prevented by callers passing ids produced by this model).
        // SAFETY: as the comment above says.
        unsafe { sys::llama_vocab_is_eog(self.vocab(), token) }
    }

    /// Tokenize `text`. `add_special` adds BOS where the model wants it;
    /// `parse_special` turns control-token text (e.g. `<|im_start|>`) into tokens.
    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<Token>, LlamaError> {
        let len = i32::try_from(text.len())
            .map_err(|_| LlamaError::Tokenize("text longer than 2 GiB".into()))?;
        let mut out: Vec<Token> = vec![0; text.len() + 8];
        for _ in 0..2 {
            // `text` is valid for `len` bytes (need not be NUL-terminated);
            // `out` is writable for `out.len()` tokens.
            // SAFETY: as the comment above says.
            let n = unsafe {
                sys::llama_tokenize(
                    self.vocab(),
                    text.as_ptr() as *const c_char,
                    len,
                    out.as_mut_ptr(),
                    out.len() as i32,
                    add_special,
                    parse_special,
                )
            };
            if n >= 0 {
                out.truncate(n as usize);
                return Ok(out);
            }
            if n == i32::MIN {
                break;
            }
            out.resize((-n) as usize, 0);
        }
        Err(LlamaError::Tokenize("llama_tokenize failed".into()))
    }

    /// The bytes one token stands for (may be part of a UTF-8 sequence).
    pub fn token_bytes(&self, token: Token) -> Vec<u8> {
        self.piece_bytes(token, false)
    }

    /// A token's bytes; `special`: control tokens as their text, not empty.
    fn piece_bytes(&self, token: Token, special: bool) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        for _ in 0..2 {
            // `buf` is writable for `buf.len()` bytes; the call does not
            // write a terminator beyond that length.
            // SAFETY: as the comment above says.
            let n = unsafe {
                sys::llama_token_to_piece(
                    self.vocab(),
                    token,
                    buf.as_mut_ptr() as *mut c_char,
                    buf.len() as i32,
                    0,
                    special,
                )
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return buf;
            }
            buf.resize((-n) as usize, 0);
        }
        Vec::new()
    }

    /// Detokenize a whole sequence (lossy UTF-8).
    pub fn detokenize(&self, tokens: &[Token]) -> String {
        let bytes: Vec<u8> = tokens.iter().flat_map(|&t| self.token_bytes(t)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The text of the beginning- and end-of-sequence tokens (empty when the
    /// vocabulary has none), as chat templates name them.
    pub fn bos_eos_text(&self) -> (String, String) {
        // SAFETY: valid vocabulary; plain getters (-1 when the token is absent).
        let (bos, eos) = unsafe {
            (
                sys::llama_vocab_bos(self.vocab()),
                sys::llama_vocab_eos(self.vocab()),
            )
        };
        let text = |t: Token| {
            if t < 0 {
                String::new()
            } else {
                String::from_utf8_lossy(&self.piece_bytes(t, true)).into_owned()
            }
        };
        (text(bos), text(eos))
    }

    /// The model's own chat template, if its gguf carries one.
    pub fn chat_template(&self) -> Option<String> {
        // Valid model; a null name asks for the default template. The
        // returned string is owned by the model.
        // SAFETY: as the comment above says.
        let p = unsafe { sys::llama_model_chat_template(self.ptr.as_ptr(), std::ptr::null()) };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated, owned by the model for its lifetime.
        let name = unsafe { std::ffi::CStr::from_ptr(p) };
        Some(name.to_string_lossy().into_owned())
    }

    /// Format `messages` with the model's chat template and open the assistant turn.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, LlamaError> {
        let tmpl = self.chat_template().ok_or_else(|| {
            LlamaError::ChatTemplate(format!(
                "{} has no chat template (tokenizer.chat_template); run without --chat",
                self.path.display()
            ))
        })?;
        let ctmpl =
            CString::new(tmpl).map_err(|_| LlamaError::ChatTemplate("NUL in template".into()))?;
        let owned: Vec<(CString, CString)> = messages
            .iter()
            .map(|m| {
                Ok((
                    CString::new(m.role.as_str())?,
                    CString::new(m.content.as_str())?,
                ))
            })
            .collect::<Result<_, std::ffi::NulError>>()
            .map_err(|_| LlamaError::ChatTemplate("NUL byte in a chat message".into()))?;
        let msgs: Vec<sys::llama_chat_message> = owned
            .iter()
            .map(|(r, c)| sys::llama_chat_message {
                role: r.as_ptr(),
                content: c.as_ptr(),
            })
            .collect();
        let total: usize = messages
            .iter()
            .map(|m| m.content.len() + m.role.len())
            .sum();
        let mut buf = vec![0u8; 2 * total + 256];
        for _ in 0..2 {
            // `msgs` points into `owned`, alive for the call; `buf` is writable
            // for `buf.len()` bytes.
            // SAFETY: as the comment above says.
            let n = unsafe {
                sys::llama_chat_apply_template(
                    ctmpl.as_ptr(),
                    msgs.as_ptr(),
                    msgs.len(),
                    true,
                    buf.as_mut_ptr() as *mut c_char,
                    buf.len() as i32,
                )
            };
            if n < 0 {
                return Err(LlamaError::ChatTemplate(
                    "llama.cpp does not support this model's chat template".into(),
                ));
            }
            if (n as usize) <= buf.len() {
                buf.truncate(n as usize);
                return String::from_utf8(buf).map_err(|_| {
                    LlamaError::ChatTemplate("template produced invalid UTF-8".into())
                });
            }
            buf.resize(n as usize, 0);
        }
        Err(LlamaError::ChatTemplate(
            "template output kept growing".into(),
        ))
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // The pointer came from llama_model_load_from_file and is freed once;
        // contexts borrow the model, so none outlives it.
        // SAFETY: as the comment above says.
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_progress_is_quiet_at_first_then_throttled() {
        let t0 = Instant::now();
        let mut p = LoadProgress::new("load m".into(), t0);
        assert_eq!(p.update(0.5, t0 + Duration::from_millis(1000)), None);
        assert!(!p.shown());
        let at = t0 + Duration::from_millis(2000);
        assert_eq!(p.update(0.5, at).as_deref(), Some("\rload m:  50% (2.0 s)"));
        assert_eq!(p.update(0.6, at + Duration::from_millis(100)), None);
        let end = p.update(1.0, at + Duration::from_millis(200));
        assert!(end.unwrap().contains("100%"));
        assert!(p.shown());
    }
}
