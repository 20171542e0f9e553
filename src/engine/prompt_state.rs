//! `bmoe run --prompt-cache-file FILE` (llama.cpp's habit): the prompt's KV state
//! restored from FILE when the tokens it holds start the prompt (the rest is
//! prefilled), and the prompt's state written to FILE after the run. A file
//! of another model or bmoe, or a damaged one, is a warning and a plain
//! prefill; one holding more tokens than the context, a note and a prefill.
//! Also what names a state ([`ident_of`], used by serve).

use std::path::Path;

use super::config::RunConfig;
use super::refusal::StateReadError;
use crate::llama::{Context, Token};
use crate::prompt_cache::{self, Ident};

/// What names the states this configuration makes: the model file, `-c`,
/// the KV streams of a state (`Context::state_streams`), the settings that
/// change the KV values, the bmoe version.
pub fn ident_of(cfg: &RunConfig, n_ctx: u32, state_streams: u32) -> std::io::Result<Ident> {
    let memo = cfg.prompt_states.model_id_memo.as_deref();
    let (model_bytes, model_hash) = prompt_cache::model_id(&cfg.model, memo)?;
    let drop_cold = cfg.mode.stream().map_or(0.0, |s| s.drop_cold);
    let k = cfg
        .n_expert_used
        .map_or("the model's".to_string(), |k| k.to_string());
    Ok(Ident {
        bmoe_version: crate::VERSION.to_string(),
        model_bytes,
        model_hash,
        n_ctx,
        state_streams,
        settings: format!("--n-expert-used {k}, --drop-cold-experts {drop_cold}"),
    })
}

/// The entry in `file` (named by `ident`), read only when it fits in the
/// memory available: a user-named file is never read past what the host has.
pub(super) fn read_within_memory(
    file: &Path,
    ident: &Ident,
) -> Result<prompt_cache::Entry, StateReadError> {
    let bytes = std::fs::metadata(file)
        .map_err(|source| StateReadError::Stat {
            file: file.to_path_buf(),
            source,
        })?
        .len();
    let available = crate::stream::memory::mem_available_bytes().unwrap_or(u64::MAX);
    if bytes > available {
        return Err(StateReadError::OverMemory {
            file: file.to_path_buf(),
            mib: bytes >> 20,
            available_mib: available >> 20,
        });
    }
    Ok(prompt_cache::read_entry(file, ident)?)
}

/// Put the state in `file` into sequence 0 when its tokens share a prefix
/// with `prompt`; how many prompt tokens it holds (0: none, said why).
pub(super) fn restore(ctx: &mut Context, file: &Path, ident: &Ident, prompt: &[Token]) -> usize {
    if !file.exists() {
        return 0;
    }
    let entry = match read_within_memory(file, ident) {
        Ok(e) => e,
        Err(e) => {
            crate::say!("warning: {e}; the prompt is prefilled");
            return 0;
        }
    };
    if !ident.fits(entry.tokens.len()) {
        crate::say!(
            "prompt cache: {} holds {} tokens, more than this context's {} (-c): the prompt is prefilled",
            file.display(),
            entry.tokens.len(),
            ident.n_ctx
        );
        return 0;
    }
    let common = prompt_cache::common_prefix(&entry.tokens, prompt).min(prompt.len() - 1);
    if common == 0 {
        crate::say!(
            "prompt cache: {} holds another prompt; the prompt is prefilled",
            file.display()
        );
        return 0;
    }
    match ctx.set_seq_state(0, &entry.state) {
        Ok(()) => {
            crate::say!(
                "prompt cache: {common} of {} prompt tokens restored from {}",
                prompt.len(),
                file.display()
            );
            common
        }
        Err(e) => {
            crate::say!(
                "warning: prompt cache {}: {e}; the prompt is prefilled",
                file.display()
            );
            0
        }
    }
}

/// Write the prompt's state (sequence 0 cut back to the prompt) to `file`.
pub(super) fn save(ctx: &mut Context, file: &Path, ident: &Ident, prompt: &[Token]) {
    if file.exists() && !prompt_cache::is_cache_file(file) {
        crate::say!(
            "warning: --prompt-cache-file {} is not a bmoe prompt cache file: left as it is, the state not saved",
            file.display()
        );
        return;
    }
    ctx.trim(prompt.len() as i32, -1);
    let written = ctx.seq_state(0).map_err(|e| e.to_string()).and_then(|s| {
        prompt_cache::write_entry(file, ident, prompt, &s).map_err(|e| e.to_string())
    });
    match written {
        Ok(n) => crate::say!(
            "prompt cache: the prompt's {} tokens saved to {} ({n} bytes)",
            prompt.len(),
            file.display()
        ),
        Err(e) => crate::say!("warning: prompt cache {}: {e}; not saved", file.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 64: a user-named state file is never read past the memory the
    /// host has (a sparse 4 TiB file is refused from its size alone).
    #[test]
    fn a_state_file_larger_than_memory_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("huge.kv");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(4 << 40)
            .unwrap();
        let ident = Ident {
            bmoe_version: String::new(),
            model_bytes: 0,
            model_hash: String::new(),
            n_ctx: 0,
            state_streams: 1,
            settings: String::new(),
        };
        let e = read_within_memory(&file, &ident).unwrap_err();
        assert!(matches!(e, StateReadError::OverMemory { .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains("more than the") && e.contains("not read"), "{e}");
    }
}
