//! `bmoe serve`: an OpenAI-compatible HTTP server (axum on a tokio runtime)
//! in front of one engine thread that keeps the model, its KV cache and its
//! expert cache warm between requests (docs/serving.md).

mod answer;
mod anthropic;
mod app;
mod auth;
mod common;
mod constraint;
mod error;
mod job;
mod job_prompt;
mod job_request;
mod json_in;
mod metrics;
mod openai;
mod prompt_cache;
mod responses;
mod routes;
mod sink;
mod split;
pub mod supervisor;
mod tenant;
mod tool_names;
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bmoe_decode::sampling::SamplingParams;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::engine::RunConfig;
pub use error::ServeError;
pub use tenant::CacheScope;
pub(crate) use worker::ModelReady;

/// How long in-flight requests get to finish after SIGINT/SIGTERM.
pub(crate) const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(10);

/// The server's settings beyond the engine's.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub engine: RunConfig,
    pub addr: SocketAddr,
    /// Requests that may wait for the engine; more get 429.
    pub queue: usize,
    /// Requests decoded together.
    pub parallel: usize,
    /// `--api-key`s (none: no key asked); each is a tenant of its own.
    pub api_keys: Vec<String>,
    /// `--prompt-cache-scope`: tenants within a key.
    pub cache_scope: CacheScope,
    pub body_limit_bytes: usize,
    /// The sampler settings requests start from (`bmoe serve --temp ...`).
    pub defaults: SamplingParams,
    /// The names `/v1/models` lists (`--served-name`); none: the model
    /// file's name without `.gguf`.
    pub served_names: Vec<String>,
    /// `--prompt-cache` (None: off).
    pub prompt_cache: Option<crate::prompt_cache::Config>,
}

/// Load the model, then serve until SIGINT/SIGTERM; `on_ready` is told the
/// address and what loading decided once requests are accepted.
pub fn serve(
    cfg: ServeConfig,
    on_ready: impl FnOnce(SocketAddr, &ModelReady),
) -> Result<(), ServeError> {
    let prometheus = metrics::install().map_err(ServeError::Metrics)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (worker, loaded) = worker::Worker::start(
        cfg.engine.clone(),
        cfg.queue,
        cfg.parallel,
        rt.handle().clone(),
        cfg.prompt_cache.clone(),
    )?;
    let served_names = if cfg.served_names.is_empty() {
        vec![model_id(&cfg.engine.model)]
    } else {
        cfg.served_names.clone()
    };
    let app = Arc::new(app::Shared {
        jobs: worker.jobs.clone(),
        model_id: served_names[0].clone(),
        served_names,
        defaults: cfg.defaults.clone(),
        api_keys: cfg.api_keys.clone(),
        cache_scope: cfg.cache_scope,
        body_limit_bytes: cfg.body_limit_bytes,
        next_id: Default::default(),
        run_id: run_id(),
        default_max_tokens: cfg.engine.job.n_predict,
        context_length: loaded.n_ctx,
        call_format: loaded.call_format,
        thinks: loaded.thinks,
        created_s: job::now_s(),
    });
    let served = rt.block_on(async {
        let stop = shutdown_on_signal()?;
        let listener = tokio::net::TcpListener::bind(cfg.addr)
            .await
            .map_err(|source| ServeError::Bind { addr: cfg.addr, source })?;
        let addr = listener.local_addr()?;
        on_ready(addr, &loaded);
        let router = routes::router(app.clone(), prometheus);
        let server =
            axum::serve(listener, router).with_graceful_shutdown(stopping(stop.clone()));
        tokio::select! {
            r = server => r.map_err(ServeError::Io),
            _ = async { stopping(stop).await; tokio::time::sleep(SHUTDOWN_DEADLINE).await } => {
                tracing::warn!("requests still open {SHUTDOWN_DEADLINE:?} after the signal: closing them");
                Ok(())
            }
        }
    });
    drop(app);
    rt.shutdown_timeout(Duration::from_secs(1));
    if !worker.stop(SHUTDOWN_DEADLINE) {
        tracing::warn!("the engine thread did not end within {SHUTDOWN_DEADLINE:?}");
    }
    served
}

/// The shutdown message: a task that waits for SIGINT, SIGTERM or SIGHUP and
/// then says `true` on the returned channel. The process-wide handlers
/// (`crate::interrupt`) still record the signal first, so decodes in flight stop
/// at once and a second signal exits; a signal that came before this call
/// (while the model loaded) counts too.
fn shutdown_on_signal() -> Result<watch::Receiver<bool>, ServeError> {
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let (tx, rx) = watch::channel(crate::interrupt::requested().is_some());
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
        let _ = tx.send(true);
    });
    Ok(rx)
}

/// Resolves once the shutdown message came (or its sender is gone).
async fn stopping(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// Twelve hex digits from the OS's random source (the clock should it fail),
/// so that response ids differ between runs of the server.
fn run_id() -> String {
    let r = getrandom::u64().unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ u64::from(std::process::id()).rotate_left(32)
    });
    format!("{:012x}", r & 0xffff_ffff_ffff)
}

/// The id `/v1/models` lists: the model file's name without `.gguf`.
fn model_id(path: &std::path::Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}
