//! `bmoe serve`: the model, streaming and sampling groups (sampling as the
//! requests' defaults), the server's and the prompt cache's flags checked,
//! the server started, its address and what loading decided said on stderr.

use std::net::{IpAddr, SocketAddr};

use anyhow::Result;
use clap::Args;

use bmoe::serve::{self, supervisor, ServeConfig};

use super::model::{ModelArgs, Shared};
use super::sampling::SamplingArgs;
use super::stream::{StreamExtras, StreamingArgs};
use super::usage::UsageError;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub streaming: StreamingArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: super::spec::ChatSpecArgs,
    #[command(flatten, next_help_heading = "Server")]
    pub tokens: super::tokens::TokensArg,
    /// Address to listen on (loopback unless told otherwise).
    #[arg(help_heading = "Server", long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to listen on (0: any free port, said at start).
    #[arg(help_heading = "Server", long, default_value_t = 8080)]
    pub port: u16,
    /// Requests decoded together, one batch per step (each gets its own -c
    /// positions of KV cache).
    #[arg(help_heading = "Server", long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub parallel: u32,
    /// Requests that may wait while every --parallel slot is busy; more get 429.
    #[arg(help_heading = "Server", long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub queue: u32,
    /// Require `Authorization: Bearer KEY` on every route but /health;
    /// repeat it for several clients: each key's prompts are reused (KV
    /// sequences, prompt cache) by requests with that key only.
    #[arg(
        help_heading = "Server",
        long,
        value_name = "KEY",
        env = "BMOE_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Vec<String>,
    /// Largest request body in KiB; larger ones get 413.
    #[arg(help_heading = "Server", long, value_name = "KIB", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub body_limit_kb: u64,
    /// The model's name in /v1/models and in replies (repeat it, or give a
    /// comma list, for several); default: the model file's name without
    /// `.gguf`. Name what your client asks for (e.g. Claude Code's --model).
    #[arg(
        help_heading = "Server",
        long = "served-name",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub served_name: Vec<String>,
    #[command(flatten)]
    pub prompt_cache: super::prompt_cache::PromptCacheArgs,
}

impl ServeArgs {
    /// The groups serve shares with run and chat.
    pub fn shared(&self) -> Shared<'_> {
        Shared {
            model: &self.model,
            streaming: &self.streaming,
            sampling: &self.sampling,
        }
    }

    /// The engine's configuration, whole: the shared groups', -n as the
    /// requests' default length, and the expert cache leaving the prompt
    /// cache's RAM to it.
    fn engine_config(
        &self,
        model: std::path::PathBuf,
        prompt_cache: Option<&bmoe::prompt_cache::Config>,
    ) -> Result<bmoe::engine::RunConfig, UsageError> {
        let extras = StreamExtras {
            route_trace: None,
            reserved_bytes: prompt_cache.map_or(0, |pc| pc.ram_bytes),
        };
        let mut cfg =
            self.shared()
                .engine_config(model, String::new(), self.tokens.n_predict, extras)?;
        cfg.speculation = self.spec.config();
        Ok(cfg)
    }
}

/// `bmoe serve`: check, load, serve until SIGINT/SIGTERM.
pub fn serve(args: ServeArgs) -> Result<()> {
    super::model::warn_threads_above_cores(args.model.threads);
    super::model::shared_args(&args.shared())?;
    args.sampling.check_speculation(args.spec.ngram)?;
    for key in &args.api_key {
        check_api_key(key)?;
    }
    check_served_names(&args.served_name)?;
    let engine_child = supervisor::is_engine_child();
    if !args.host.is_loopback() && args.api_key.is_empty() && !engine_child {
        bmoe::say!(
            "warning: --host {} is not a loopback address and no --api-key is set: anyone who \
             reaches port {} can use this server; give --api-key KEY (or BMOE_API_KEY), or \
             leave --host at 127.0.0.1",
            args.host,
            args.port
        );
    }
    let prompt_cache = args.prompt_cache.config()?;
    let model = super::model::model_or_default(&args.model.model)?;
    if !args.model.rpc.rpc.is_empty() && !engine_child {
        return supervise(&args);
    }
    let engine = args.engine_config(model, prompt_cache.as_ref())?;
    let cfg = ServeConfig {
        defaults: engine.job.sampling.clone(),
        engine,
        // A supervised engine process serves its supervisor alone.
        addr: if engine_child {
            SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0)
        } else {
            SocketAddr::new(args.host, args.port)
        },
        queue: args.queue as usize,
        parallel: args.parallel as usize,
        api_keys: args.api_key.clone(),
        cache_scope: args.prompt_cache.prompt_cache_scope,
        body_limit_bytes: (args.body_limit_kb * 1024) as usize,
        served_names: args.served_name.clone(),
        prompt_cache,
    };
    let parallel = cfg.parallel;
    serve::serve(cfg, |addr, loaded| {
        for note in &loaded.notes {
            bmoe::say!("{note}");
        }
        let how = if loaded.streamed {
            "experts streamed"
        } else {
            "resident"
        };
        if engine_child {
            supervisor::announce_ready(addr);
            bmoe::say!(
                "bmoe serve: engine process {} ready ({how}, context {} tokens)",
                std::process::id(),
                loaded.n_ctx
            );
            return;
        }
        bmoe::say!(
            "bmoe serve: listening on http://{addr}/v1 ({how}, context {} tokens, {} request(s) at a time); Ctrl-C stops",
            loaded.n_ctx,
            parallel
        );
    })?;
    bmoe::say!("bmoe serve: stopped");
    Ok(())
}

/// `serve --rpc`: the same command again as a supervised engine process,
/// restarted when it loses an RPC host (docs/scale-out.md).
fn supervise(args: &ServeArgs) -> Result<()> {
    let cfg = supervisor::SupervisorConfig {
        addr: SocketAddr::new(args.host, args.port),
        program: std::env::current_exe()?,
        args: std::env::args_os().skip(1).collect(),
        restart_delay: std::time::Duration::from_secs(1),
    };
    supervisor::supervise(cfg, |addr, pid| {
        bmoe::say!(
            "bmoe serve: listening on http://{addr}/v1 (the engine in process {pid}, started \
             again should an RPC host be lost); Ctrl-C stops"
        );
    })?;
    bmoe::say!("bmoe serve: stopped");
    Ok(())
}

/// A key a client can send: not empty or blank, and no whitespace at either
/// end (HTTP drops it from a header value, so such a key never matches).
fn check_api_key(key: &str) -> Result<(), UsageError> {
    if key.trim().is_empty() {
        return Err(UsageError(
            "--api-key (or BMOE_API_KEY) is empty or blank: give a key or leave the flag out"
                .into(),
        ));
    }
    if key.trim() != key {
        return Err(UsageError(
            "--api-key (or BMOE_API_KEY) starts or ends with whitespace, which HTTP drops from \
             the header a client sends it in: give the key without it"
                .into(),
        ));
    }
    Ok(())
}

/// Served names a client can ask for: not blank, each given once.
fn check_served_names(names: &[String]) -> Result<(), UsageError> {
    for (i, n) in names.iter().enumerate() {
        if n.trim().is_empty() || n.trim() != n {
            return Err(UsageError(format!(
                "--served-name {n:?} is blank or has whitespace around it: give names such as local-model, separated by commas"
            )));
        }
        if names[..i].contains(n) {
            return Err(UsageError(format!("--served-name {n:?} is given twice")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_api_key, check_served_names, ServeArgs};

    /// `bmoe serve ARGV...`'s flags.
    fn serve_args(argv: &[&str]) -> ServeArgs {
        use clap::FromArgMatches;
        let argv = [&["bmoe", "serve"][..], argv].concat();
        let m = crate::cli::args::command()
            .try_get_matches_from(argv)
            .expect("parses");
        match crate::cli::args::Cli::from_arg_matches(&m)
            .expect("a command")
            .command
        {
            crate::cli::args::Command::Serve(a) => a,
            other => panic!("not serve: {other:?}"),
        }
    }

    /// The prompt cache's RAM is reserved from the expert cache in the one
    /// call that builds the engine's configuration (it was written into a
    /// configuration already built); a resident engine has nothing to
    /// reserve it from.
    #[test]
    fn the_engine_config_is_built_whole_with_the_prompt_cache_ram_reserved() {
        let pc = bmoe::prompt_cache::Config {
            dir: None,
            disk_cap_bytes: 0,
            ram_bytes: 64 << 20,
        };
        let build = |argv: &[&str], pc| {
            let cfg = serve_args(argv).engine_config("m.gguf".into(), pc);
            cfg.expect("a config")
        };
        let cfg = build(&["-n", "7"], Some(&pc));
        assert_eq!(cfg.job.n_predict, 7);
        let reserved = |cfg: &bmoe::engine::RunConfig| cfg.mode.stream().map(|s| s.reserved_bytes);
        assert_eq!(reserved(&cfg), Some(64 << 20));
        assert_eq!(reserved(&build(&[], None)), Some(0));
        let resident = build(&["--resident"], Some(&pc));
        assert_eq!(resident.mode, bmoe::engine::Asked::Resident);
    }

    #[test]
    fn served_names_are_not_blank_nor_twice() {
        let names = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_served_names(&names(&["a", "b"])).is_ok());
        assert!(check_served_names(&[]).is_ok());
        for bad in [&["a", ""][..], &[" a"], &["a", "a"]] {
            assert!(check_served_names(&names(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_blank_key_or_one_with_whitespace_around_it_is_refused() {
        for key in ["", " ", "\t\n", " sesame", "sesame\n"] {
            assert!(check_api_key(key).is_err(), "{key:?}");
        }
        assert!(check_api_key("ses ame").is_ok());
        assert!(check_api_key("sesame").is_ok());
    }
}
