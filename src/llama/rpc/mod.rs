//! llama.cpp's RPC backend (ggml-rpc, compiled in through `GGML_RPC=ON` in
//! `.cargo/config.toml`): remote hosts that hold whole layers in their memory.
//!
//! Two sides, one binary, so both speak the same protocol version by
//! construction: [`serve`] runs ggml's own RPC server (`bmoe rpc-server`), and
//! [`connect`] reaches servers for `--rpc` and returns their devices for
//! llama.cpp's layer placement ([`crate::llama::model::ModelParams::rpc`]).
//!
//! ggml's RPC client has no error path: a host that cannot be reached, speaks
//! another protocol version or drops the connection ends in `GGML_ABORT`
//! (`ggml-rpc.cpp`: `RPC_STATUS_ASSERT`, `rpc_dispatcher::start`). bmoe checks
//! each address with its own TCP connect first (a refusal naming the address),
//! and once a client exists it installs ggml's abort callback
//! ([`arm_lost_host_exit`]): the abort becomes a one-line error, the outputs
//! written so far go into place and the process exits with
//! [`EXIT_REMOTE_LOST`]. A host that stalls (no reply while a decode waits on
//! it) is caught by [`watchdog`].

pub mod cache;
pub mod doorman;
mod error;
pub mod net;
mod reach;
pub mod watchdog;

pub use error::{RpcError, EXIT_REMOTE_LOST, PROTOCOL_VERSION};
pub use reach::resolve;

use std::ffi::{c_char, CStr, CString};
use std::net::{SocketAddr, SocketAddrV4};
use std::path::Path;
use std::time::Duration;

use llama_cpp_sys_2 as sys;

// ggml-rpc.h is not in llama-cpp-sys-2's bindings; these are its declarations
// for the version the crate bundles (0.1.161, protocol 7.0.0).
extern "C" {
    fn ggml_backend_rpc_add_server(endpoint: *const c_char) -> sys::ggml_backend_reg_t;
    fn ggml_backend_rpc_start_server(
        endpoint: *const c_char,
        cache_dir: *const c_char,
        n_threads: usize,
        n_devices: usize,
        devices: *mut sys::ggml_backend_dev_t,
    );
}

/// One device of an RPC host: llama.cpp places layers on it.
#[derive(Debug, Clone, Copy)]
pub struct RpcDevice {
    pub(crate) ptr: sys::ggml_backend_dev_t,
    /// What the host reports free and in all.
    pub free_bytes: u64,
    pub total_bytes: u64,
}

// SAFETY: ggml's device objects are created once per process by
// `ggml_backend_rpc_add_server`, never freed, and their methods lock what they
// share (each call opens its own request on the host's connection).
unsafe impl Send for RpcDevice {}
// SAFETY: as above.
unsafe impl Sync for RpcDevice {}

/// The RPC hosts of a run, connected, with their devices in `--rpc` order.
#[derive(Debug, Clone)]
pub struct RpcHosts {
    pub endpoints: Vec<String>,
    pub peers: Vec<SocketAddr>,
    pub devices: Vec<RpcDevice>,
}

impl RpcHosts {
    /// Memory the hosts report free, in all.
    pub fn free_bytes(&self) -> u64 {
        self.devices.iter().map(|d| d.free_bytes).sum()
    }
}

/// Reach every host of `endpoints` (each resolved, connected and greeted
/// by bmoe first, so a host that is down, busy, silent or of another
/// version is refused with its address instead of ggml's abort or hang),
/// then register it with ggml's RPC client and read its devices and their
/// memory.
pub fn connect(endpoints: &[String]) -> Result<RpcHosts, RpcError> {
    let mut peers: Vec<SocketAddr> = Vec::with_capacity(endpoints.len());
    for (i, e) in endpoints.iter().enumerate() {
        if endpoints[..i].contains(e) {
            return Err(RpcError::Duplicate(e.clone()));
        }
    }
    for e in endpoints {
        let addr = reach::resolve(e)?;
        if let Some(j) = peers.iter().position(|p| *p == addr.into()) {
            return Err(RpcError::Duplicate(format!(
                "{e} (the same address as {}, {addr})",
                endpoints[j]
            )));
        }
        peers.push(addr.into());
    }
    for (e, p) in endpoints.iter().zip(&peers) {
        let SocketAddr::V4(addr) = *p else {
            return Err(RpcError::BadAddress(e.clone()));
        };
        reach::greet(e, addr, reach::REACH_TIMEOUT)?;
    }
    crate::llama::backend::init_backend();
    arm_lost_host_exit();
    let mut devices = Vec::new();
    for p in &peers {
        // ggml gets the address bmoe checked (the sockets then match `peers`).
        devices.extend(host_devices(&p.to_string())?);
    }
    Ok(RpcHosts {
        endpoints: endpoints.to_vec(),
        peers,
        devices,
    })
}

/// Register `endpoint` with ggml's RPC client and list its devices.
fn host_devices(endpoint: &str) -> Result<Vec<RpcDevice>, RpcError> {
    let c = CString::new(endpoint).map_err(|_| RpcError::BadAddress(endpoint.to_string()))?;
    // `c` is a valid NUL-terminated string for the call; ggml copies it. A
    // failed handshake aborts through the callback armed before this call.
    // SAFETY: as the comment above says.
    let reg = unsafe { ggml_backend_rpc_add_server(c.as_ptr()) };
    if reg.is_null() {
        return Err(RpcError::NoDevices(endpoint.to_string()));
    }
    // SAFETY: `reg` is the live registry object ggml just returned (never freed).
    let n = unsafe { sys::ggml_backend_reg_dev_count(reg) };
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: `i` is below the registry's device count.
        let ptr = unsafe { sys::ggml_backend_reg_dev_get(reg, i) };
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: `ptr` is a live device; both out-pointers are valid locals.
        unsafe { sys::ggml_backend_dev_memory(ptr, &mut free, &mut total) };
        out.push(RpcDevice {
            ptr,
            free_bytes: free as u64,
            total_bytes: total as u64,
        });
    }
    if out.is_empty() {
        return Err(RpcError::NoDevices(endpoint.to_string()));
    }
    Ok(out)
}

/// How `bmoe rpc-server` serves.
#[derive(Debug, Clone)]
pub struct ServerOptions<'a> {
    /// Where to listen; port 0 takes a free one (the banner names it).
    pub addr: SocketAddrV4,
    /// ggml's tensor cache folder (checked writable by the caller).
    pub cache_dir: Option<&'a Path>,
    pub threads: u32,
    /// A client that sends nothing this long after connecting is dropped.
    pub first_byte_timeout: Duration,
}

/// Serve this host's CPU to RPC clients with ggml's own server
/// (`ggml_backend_rpc_start_server`): it returns only when it cannot listen or
/// accept. The cache folder is verified first and watched while serving
/// ([`cache`]); silent clients are dropped ([`doorman`]).
pub fn serve(opts: &ServerOptions) -> Result<(), RpcError> {
    // ggml's server prints only "Failed to create server socket": bind here
    // first to say why, and to learn the port 0 stands for (the listener is
    // closed again before ggml binds that port).
    let listen_err = |e: std::io::Error| RpcError::Listen {
        endpoint: opts.addr.to_string(),
        reason: e.to_string(),
    };
    let bound = std::net::TcpListener::bind(opts.addr)
        .and_then(|l| l.local_addr())
        .map_err(listen_err)?;
    let endpoint = SocketAddrV4::new(*opts.addr.ip(), bound.port()).to_string();
    if let Some(dir) = opts.cache_dir {
        verify_cache(dir, opts.threads)?;
    }
    doorman::guard(bound.port(), opts.first_byte_timeout)
        .map_err(|e| RpcError::Doorman(e.to_string()))?;
    line_buffered_stdout();
    crate::llama::backend::init_backend();
    let bad = || RpcError::BadAddress(endpoint.clone());
    let c_end = CString::new(endpoint.as_str()).map_err(|_| bad())?;
    let c_cache = opts
        .cache_dir
        .map(|d| CString::new(d.to_string_lossy().into_owned()))
        .transpose()
        .map_err(|_| bad())?;
    // SAFETY: the CPU device is a process-wide static object (or null).
    let mut cpu = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
    if cpu.is_null() {
        return Err(RpcError::NoDevices("this host".into()));
    }
    let cache_ptr = c_cache.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // The strings and the one-device array outlive the call (it blocks while
    // serving); the device is ggml's own CPU device.
    // SAFETY: as the comment above says.
    unsafe {
        ggml_backend_rpc_start_server(
            c_end.as_ptr(),
            cache_ptr,
            opts.threads as usize,
            1,
            &mut cpu,
        )
    };
    Err(RpcError::ServerStopped(endpoint))
}

/// Verify every file of the cache folder against its name (the damaged ones
/// removed and said), then keep checking the ones written while serving.
fn verify_cache(dir: &Path, threads: u32) -> Result<(), RpcError> {
    let fail = |e: std::io::Error| RpcError::Cache {
        dir: dir.display().to_string(),
        reason: e.to_string(),
    };
    let v = cache::verify_dir(dir, threads as usize).map_err(fail)?;
    error::tell(format!(
        "rpc-server: cache {}: {} files ({} MiB) match their hashes{}",
        dir.display(),
        v.good.len(),
        v.good_bytes / (1024 * 1024),
        match v.removed {
            0 => String::new(),
            n => format!("; {n} damaged removed"),
        }
    ));
    // /proc/self/fd names open files by their canonical path.
    let canonical = dir.canonicalize().map_err(fail)?;
    cache::watch(canonical, v.good).map_err(fail)
}

/// ggml's server prints its banner with printf and flushes only when a
/// client connects: with stdout a pipe or a file, the banner (and the port)
/// would not show until then. Line buffering prints each line at once.
fn line_buffered_stdout() {
    extern "C" {
        static mut stdout: *mut libc::FILE;
    }
    // SAFETY: glibc's `stdout` is initialised before main; setvbuf is called
    // before anything is written to it, as C requires.
    unsafe {
        let out = stdout;
        libc::setvbuf(out, std::ptr::null_mut(), libc::_IOLBF, 0);
    }
}

/// From now on a ggml abort (a lost RPC host, or any other) ends the process
/// with a clear line and [`EXIT_REMOTE_LOST`] after moving the outputs
/// written so far into place, instead of a bare abort and core dump.
pub fn arm_lost_host_exit() {
    // SAFETY: installs a plain function pointer; ggml calls it from whichever
    // thread aborts, just before abort().
    unsafe { sys::ggml_set_abort_callback(Some(on_ggml_abort)) };
}

/// Print why, put the outputs in place and exit (never returns to ggml,
/// whose next step is abort()).
pub fn exit_lost(why: &str) -> ! {
    let line = format!(
        "\nerror: an RPC host was lost: {why}; the run stopped (is `bmoe rpc-server` still \
         running and reachable, from the same bmoe build?)\n"
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    bmoe_output::commit_all_from_signal_handler();
    // SAFETY: _exit ends the process at once; nothing here is left half-written
    // that the outputs' commit did not handle.
    unsafe { libc::_exit(EXIT_REMOTE_LOST) }
}

extern "C" fn on_ggml_abort(msg: *const c_char) {
    let text = if msg.is_null() {
        "ggml aborted".to_string()
    } else {
        // SAFETY: ggml passes a NUL-terminated message buffer valid for the call.
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .trim()
            .to_string()
    };
    let text = without_source_path(&text).to_string();
    if text.contains("handshake failed") {
        exit_lost(&format!(
            "{text}: the host answered with another RPC protocol version (llama.cpp's line above \
             names it; this bmoe speaks {PROTOCOL_VERSION}): run the same bmoe build on both sides"
        ));
    }
    if text.contains("RPC") || text.contains("connect") {
        exit_lost(&text);
    }
    // Another abort of llama.cpp's (not the RPC client's): said as such.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("\nerror: llama.cpp aborted: {text}\n").as_bytes(),
    );
    bmoe_output::commit_all_from_signal_handler();
    // SAFETY: as in `exit_lost`.
    unsafe { libc::_exit(1) }
}

/// ggml's abort message without its `/path/to/file.cpp:LINE: ` prefix.
fn without_source_path(msg: &str) -> &str {
    match msg.split_once(".cpp:") {
        Some((_, rest)) => rest.split_once(": ").map_or(rest, |(_, m)| m),
        None => msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggmls_source_path_is_left_out_of_the_message() {
        assert_eq!(
            without_source_path("/x/ggml-rpc.cpp:569: Remote RPC server crashed"),
            "Remote RPC server crashed"
        );
        assert_eq!(without_source_path("plain"), "plain");
    }

    #[test]
    fn a_host_given_twice_is_named_before_any_is_reached() {
        let hosts = |h: &[&str]| h.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let e = connect(&hosts(&["a:1", "a:1"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--rpc: duplicate host a:1; give each host once"
        );
        let e = connect(&hosts(&["127.0.0.1:9", "localhost:9"])).unwrap_err();
        assert!(matches!(e, RpcError::Duplicate(_)), "{e}");
        assert!(
            e.to_string()
                .contains("duplicate host localhost:9 (the same address as 127.0.0.1:9"),
            "{e}"
        );
    }

    #[test]
    fn a_host_that_is_down_is_refused_with_its_address() {
        // A port nobody listens on: bind one, note it, close it.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let e = connect(std::slice::from_ref(&addr)).unwrap_err();
        assert!(matches!(e, RpcError::Unreachable { .. }));
        assert!(e.to_string().contains(&addr), "{e}");
    }
}
