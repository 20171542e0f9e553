//! Loading a model: the parameters, llama.cpp's metadata overrides, and the
//! progress line a slow load prints.

use std::ffi::CString;
use std::io::Write as _;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use llama_cpp_sys_2 as sys;

use super::handle::Model;
use crate::llama::gguf::GgufShards;
use crate::llama::{backend::init_backend, error::LlamaError};

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
    /// caller reads what it needs (see [`crate::llama::populate`]).
    pub unpopulated: Vec<std::path::PathBuf>,
    /// Load only the vocabulary and metadata (no tensors): enough to
    /// tokenize and render chat templates.
    pub vocab_only: bool,
    /// Place the last layers on RPC hosts' devices (`--rpc`).
    pub rpc: Option<RpcPlacement>,
}

/// Which layers llama.cpp puts on the RPC devices: the last `layers` trunk
/// layers and the output layer (its `n_gpu_layers` = `layers` + 1), split
/// over `devices` by their reported free memory.
#[derive(Debug, Clone)]
pub struct RpcPlacement {
    pub devices: Vec<crate::llama::rpc::RpcDevice>,
    pub layers: u32,
}

impl Default for ModelParams {
    fn default() -> Self {
        Self {
            use_mmap: true,
            load_mtp: false,
            int_overrides: Vec::new(),
            unpopulated: Vec::new(),
            vocab_only: false,
            rpc: None,
        }
    }
}

/// Load progress on stderr, once a load has taken longer than [`Self::QUIET`]:
/// one line updated in place at most every half second.
pub(crate) struct LoadProgress {
    label: String,
    started: Instant,
    last: Option<Instant>,
}

impl LoadProgress {
    /// Loads shorter than this print nothing.
    const QUIET: Duration = Duration::from_millis(1500);

    pub(crate) fn new(label: String, started: Instant) -> Self {
        Self {
            label,
            started,
            last: None,
        }
    }

    /// What to print for `frac` (0..=1) done at `now`, if anything.
    pub(crate) fn update(&mut self, frac: f32, now: Instant) -> Option<String> {
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
    pub(crate) fn shown(&self) -> bool {
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

impl Model {
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
        mp.vocab_only = params.vocab_only;
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
        // Null-terminated, alive for the whole load call.
        let mut devices: Vec<sys::ggml_backend_dev_t> = Vec::new();
        if let Some(r) = &params.rpc {
            devices.extend(r.devices.iter().map(|d| d.ptr));
            devices.push(std::ptr::null_mut());
            mp.devices = devices.as_mut_ptr();
            mp.n_gpu_layers = r.layers.saturating_add(1).min(i32::MAX as u32) as i32;
        }
        let unpopulated: Vec<&Path> = params.unpopulated.iter().map(|p| p.as_path()).collect();
        let armed =
            (!unpopulated.is_empty()).then(|| crate::llama::populate::Armed::new(&unpopulated));
        // `cpath` is a valid NUL-terminated string for the call; `mp` is a
        // fully initialised parameter struct whose pointers (path, overrides
        // terminated by an empty key, the progress state, the RPC device list
        // terminated by null, whose devices ggml never frees) stay valid for
        // the whole call.
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
            decoding: AtomicBool::new(false),
            mtp_loaded: params.load_mtp,
        })
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
