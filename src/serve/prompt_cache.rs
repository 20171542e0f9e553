//! The prompt cache's hooks in the engine thread: before a job starts, the
//! longest cached prefix of its prompt put back into the sequence it will
//! run in (when longer than what that sequence holds); after it ends and its
//! reply is sent, the sequence's state kept (RAM now, disk by the writer).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::metrics as m;
use crate::engine::prompt_state;
use crate::engine::RunConfig;
use crate::engine::Session;
use crate::generate::Multi;
use crate::llama::{Context, Token};
use crate::prompt_cache::{self, ExpertSet, PromptCache};

/// A cached prefix shorter than this is not worth a restore.
const MIN_RESTORE_TOKENS: usize = 8;
/// A sequence holding fewer tokens is not saved.
const MIN_SAVE_TOKENS: usize = 16;
/// How long the writer gets to finish its queue at shutdown.
const WRITER_DEADLINE: Duration = Duration::from_secs(10);

/// The cache and what each sequence's job restored.
pub(crate) struct Hook {
    cache: PromptCache,
    /// The cache directory (None: RAM only), where the expert set is kept.
    root: Option<std::path::PathBuf>,
    /// Tokens restored for the job running in each sequence.
    restored: Vec<usize>,
}

/// The cache on `cfg`'s directory, or in RAM alone (a warning) when the
/// directory cannot be used (read-only, not a folder): a RAM tier does not
/// need it. The directory in use comes back beside it.
fn open_or_ram_only(
    cfg: &prompt_cache::Config,
    id: prompt_cache::Ident,
) -> Result<(PromptCache, Option<std::path::PathBuf>), String> {
    match PromptCache::open(cfg, id.clone()) {
        Ok(cache) => Ok((cache, cfg.dir.clone())),
        Err(e) if cfg.dir.is_some() && cfg.ram_bytes > 0 => {
            tracing::warn!("{e}: the prompt cache keeps states in RAM only");
            let ram = prompt_cache::Config {
                dir: None,
                ..cfg.clone()
            };
            let cache = PromptCache::open(&ram, id).map_err(|e| e.to_string())?;
            Ok((cache, None))
        }
        Err(e) => Err(e.to_string()),
    }
}

impl Hook {
    /// Open the cache (None, with a warning, when it cannot be: serving
    /// goes on without it).
    pub(crate) fn open(
        cfg: &prompt_cache::Config,
        run: &RunConfig,
        session: &Session,
        n_seq: usize,
    ) -> Option<Self> {
        let opened = session
            .state_ident(run)
            .map_err(|e| format!("cannot read {}: {e}", run.model.display()))
            .and_then(|id| open_or_ram_only(cfg, id));
        match opened {
            Ok((cache, root)) => Some(Self {
                cache,
                root,
                restored: vec![0; n_seq],
            }),
            Err(e) => {
                tracing::warn!("the prompt cache is off: {e}");
                None
            }
        }
    }

    /// Put the longest cached prefix of `prompt` that `scope` may reuse
    /// into the sequence it will run in; a state llama.cpp refuses is a
    /// warning and a plain prefill.
    pub(crate) fn restore<S>(
        &mut self,
        ctx: &mut Context,
        multi: &mut Multi<S>,
        prompt: &[Token],
        scope: u64,
    ) where
        S: crate::generate::GenerationSink,
    {
        let Some((seq, held)) = multi.target(prompt, scope) else {
            return;
        };
        self.restored[seq as usize] = 0;
        let Some(hit) = self.cache.lookup(scope, prompt, held, MIN_RESTORE_TOKENS) else {
            return;
        };
        match prompt_state::put(ctx, seq, &hit.state) {
            Ok(()) => {
                multi.set_held(seq, hit.tokens.to_vec(), scope);
                self.restored[seq as usize] = hit.common.min(prompt.len() - 1).saturating_sub(held);
            }
            Err(e) => {
                tracing::warn!("prompt cache: {e}; the prompt is prefilled instead");
                multi.set_held(seq, Vec::new(), scope);
            }
        }
        self.count_bytes();
    }

    /// The tokens restored for the job that ran in `seq` (it ended).
    pub(crate) fn take_restored(&mut self, seq: i32) -> usize {
        std::mem::take(&mut self.restored[seq as usize])
    }

    /// Keep the state of sequence `seq` (its job ended and its reply was
    /// sent): in RAM now, on disk by the writer.
    pub(crate) fn save<S>(&mut self, ctx: &mut Context, multi: &Multi<S>, seq: i32)
    where
        S: crate::generate::GenerationSink,
    {
        let held = multi.held(seq);
        if held.len() >= MIN_SAVE_TOKENS {
            match prompt_state::take(ctx, seq, held.len()) {
                Ok(state) => self.cache.save(multi.scope(seq), held.to_vec(), state),
                Err(e) => tracing::warn!("prompt cache: {e}; this prompt is not kept"),
            }
        }
        self.count_bytes();
    }

    fn count_bytes(&self) {
        let s = self.cache.stats();
        m::prompt_cache_bytes(
            s.read_bytes.load(Ordering::Relaxed),
            s.written_bytes.load(Ordering::Relaxed),
        );
    }

    /// Start reading back, in the background, the expert slots the last
    /// server on this directory held when it stopped (streamed experts and
    /// a cache directory only); what happened is logged.
    pub(crate) fn warm_experts(&self, session: &Session) {
        let (Some(root), Some(identity)) = (&self.root, session.expert_identity()) else {
            return;
        };
        let read = identity
            .map_err(|e| e.to_string())
            .and_then(|id| ExpertSet::read(root, id).map_err(|e| e.to_string()));
        let set = match read {
            Ok(Some(set)) => set,
            Ok(None) => return,
            Err(e) => return tracing::warn!("the expert cache starts cold: {e}"),
        };
        match session.warm_experts(&set) {
            Ok(n) => tracing::info!(
                "prompt cache: {n} of the {} expert slots held at the last stop queued to read",
                set.slots.len()
            ),
            Err(e) => tracing::warn!("the expert cache starts cold: {e}"),
        }
    }

    /// Keep the expert slots resident now beside the cache, for the next
    /// start ([`Self::warm_experts`]); a failure is a warning.
    pub(crate) fn keep_experts(&self, session: &Session) {
        let (Some(root), Some(set)) = (&self.root, session.expert_set()) else {
            return;
        };
        match set
            .map_err(|e| e.to_string())
            .and_then(|s| s.write(root).map_err(|e| e.to_string()))
        {
            Ok(path) => tracing::info!("prompt cache: the expert set kept in {}", path.display()),
            Err(e) => tracing::warn!("the expert set was not kept: {e}"),
        }
    }

    /// Stop the writer (its queue written first, within a deadline).
    pub(crate) fn close(self) {
        if !self.cache.close(WRITER_DEADLINE) {
            tracing::warn!("the prompt cache's writer did not end within {WRITER_DEADLINE:?}");
        }
    }
}
