//! `--prompt-cache` and its sizes for `bmoe serve`: the directory (default
//! `prompt-cache` in bmoe's cache folder, `off` for none), the disk cap and
//! the RAM budget.

use std::path::PathBuf;

use clap::Args;

use bmoe::prompt_cache::Config;

use super::usage::UsageError;

const MIB: u64 = 1 << 20;

#[derive(Debug, Args)]
#[command(next_help_heading = "Prompt cache")]
pub struct PromptCacheArgs {
    /// The prompt cache's directory (default `prompt-cache` in bmoe's cache
    /// folder), or off: recent prompts' KV states, so a prompt starting with
    /// a cached prefix prefills only the rest (docs/serving.md).
    #[arg(long, value_name = "DIR|off")]
    pub prompt_cache: Option<PathBuf>,
    /// The most MiB the --prompt-cache directory may hold (every model's
    /// entries together); the least recently used go first.
    #[arg(long, value_name = "MIB", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub prompt_cache_mb: u64,
    /// MiB of prompt states kept in RAM (0: disk only); --cache-mb auto
    /// takes it out of what the host can spare before sizing the expert cache.
    #[arg(long, value_name = "MIB", default_value_t = 512, value_parser = clap::value_parser!(u64).range(0..=1 << 30))]
    pub prompt_cache_ram_mb: u64,
    /// Who reuses whose prompts: `key`, each --api-key's clients their own
    /// (everyone, without a key); `user`, also each request's `user` label
    /// within a key (docs/serving.md, "What a shared server reveals").
    #[arg(long, value_enum, value_name = "SCOPE", default_value_t = bmoe::serve::CacheScope::Key)]
    pub prompt_cache_scope: bmoe::serve::CacheScope,
}

impl PromptCacheArgs {
    /// The cache `--prompt-cache` asks for (None: off).
    pub fn config(&self) -> Result<Option<Config>, UsageError> {
        let dir = match self.prompt_cache.as_deref() {
            Some(p) if p.as_os_str() == "off" => return Ok(None),
            Some(p) if p.as_os_str().is_empty() => {
                return Err(UsageError(
                    "--prompt-cache is empty: give a directory, or off".into(),
                ))
            }
            Some(p) => p.to_path_buf(),
            None => bmoe::fixture::cache_dir()
                .map_err(|e| {
                    UsageError(format!(
                        "--prompt-cache: {e} (or give --prompt-cache DIR|off)"
                    ))
                })?
                .join("prompt-cache"),
        };
        self.check_ram(bmoe::stream::memory::meminfo_bytes("MemTotal"))?;
        if dir.exists() && !dir.is_dir() {
            return Err(UsageError(format!(
                "--prompt-cache {} is not a directory: give a directory, or off",
                dir.display()
            )));
        }
        Ok(Some(Config {
            dir: Some(dir),
            disk_cap_bytes: self.prompt_cache_mb * MIB,
            ram_bytes: self.prompt_cache_ram_mb * MIB,
        }))
    }
}

impl PromptCacheArgs {
    /// `--prompt-cache-ram-mb` within the host's memory (`total_bytes`, if
    /// known): more would leave the expert cache nothing, silently.
    fn check_ram(&self, total_bytes: Option<u64>) -> Result<(), UsageError> {
        match total_bytes {
            Some(total) if self.prompt_cache_ram_mb * MIB > total / 2 => Err(UsageError(format!(
                "--prompt-cache-ram-mb {} is more than half of this host's memory ({} MiB): the \
                 expert cache would be left nothing; give at most {}",
                self.prompt_cache_ram_mb,
                total / MIB,
                total / 2 / MIB
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 64, finding 9: a RAM tier past half the host's memory is a
    /// usage error (it silently left the expert cache 0 MiB).
    #[test]
    fn a_ram_tier_past_half_the_memory_is_refused() {
        let args = |mb| PromptCacheArgs {
            prompt_cache: None,
            prompt_cache_mb: 4096,
            prompt_cache_ram_mb: mb,
            prompt_cache_scope: Default::default(),
        };
        let total = Some(16 << 30);
        assert!(args(512).check_ram(total).is_ok());
        let e = args(100_000_000).check_ram(total).unwrap_err();
        assert!(e.0.contains("give at most 8192"), "{}", e.0);
        assert!(args(100_000_000).check_ram(None).is_ok(), "unknown memory");
    }
}
