//! `bmoe run`: the prompt and flags checked, the engine run, its text, summary
//! and `BMOE_DONE` line written.

use std::path::{Path, PathBuf};

use anyhow::Result;

use bmoe::chat::ChatTemplate;
use bmoe::engine::{self, EngineError, Mode, RunConfig, RunReport};
use bmoe::generate::GenerateError;
use bmoe::llama;

use super::checks::{self, UsageError};
use super::RunArgs;

/// `bmoe run`: check the arguments, run the engine with its text on stdout,
/// then write the summary and the `BMOE_DONE` line.
pub fn run(args: RunArgs) -> Result<()> {
    let prompt = checked_prompt(&args)?;
    let model = model_of(&args)?;
    let mut cfg = run_config(&args, model, prompt)?;
    cfg.prompt_cache = args.prompt_cache.clone();
    if args.show_prompt {
        return show_prompt(&cfg);
    }
    let progress = args.progress;
    // A failed write stops generation at the next token (the engine checks).
    let res = engine::run(&cfg, |s| {
        if !progress {
            let _ = bmoe::stdio::out(s);
        }
    });
    // A run that failed mid-way still reports what it did (aborted=1).
    let res = match res {
        // A refusal (a prompt too long, a context that does not fit) ran
        // nothing: no BMOE_DONE for it.
        Err(EngineError::Failed { cause, done_line }) => {
            if !cause.is_refusal() {
                let _ = done(progress, &done_line);
            }
            Err(*cause)
        }
        other => other,
    };
    let report = explained(res, &args, &cfg.model)?;
    if !progress {
        let _ = bmoe::stdio::out("\n");
    }
    for line in report.summary_lines() {
        bmoe::say!("{line}");
    }
    let _ = done(progress, &report.done_line);
    // The text could not be written: generation stopped there (the CSV says
    // aborted=1); the run failed.
    match bmoe::stdio::stdout_failed() {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// The checks that need no model, and the prompt (from -p or -f).
fn checked_prompt(args: &RunArgs) -> Result<String> {
    let inputs = checks::run_inputs(args);
    if let Some(csv) = args.csv.as_deref() {
        checks::output_file("--csv", csv, &inputs)?;
    }
    if let Some(t) = &args.stream.route_trace {
        checks::output_file("--route-trace", t, &inputs)?;
    }
    if let Some(f) = &args.prompt_cache {
        // Read, then rewritten; the inputs above never include it (filtering
        // it out of them by path would also let it name the model).
        checks::output_file("--prompt-cache", f, &inputs)?;
    }
    if let bmoe::stream::WarmSource::File(f) = &args.stream.cache_warm {
        // The profile is read, then updated: only the other inputs count.
        let others: Vec<&Path> = inputs.iter().copied().filter(|&i| i != f).collect();
        checks::output_file("--cache-warm", f, &others)?;
    }
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => checks::read_prompt_file(f)?,
        (None, None) => {
            return Err(
                UsageError("give a prompt with -p/--prompt TEXT or -f/--file FILE".into()).into(),
            )
        }
    };
    checks::prompt_text(&prompt, args.chat)?;
    checks::warn_threads_above_cores(args.threads);
    checks::run_args(args)?;
    Ok(prompt)
}

/// The model (-m, or the default fixture prepared), with `--n-expert-used`
/// checked against it.
fn model_of(args: &RunArgs) -> Result<PathBuf> {
    let model = super::commands::model_or_default(&args.model)?;
    if let Some(k) = args.n_expert_used {
        super::graph::check_experts_used(&model, k, args.ctx)?;
    }
    Ok(model)
}

/// The engine's configuration from the arguments.
pub(super) fn run_config(
    args: &RunArgs,
    model: PathBuf,
    prompt: String,
) -> Result<RunConfig, UsageError> {
    let sampling = args.sampling.params()?;
    let mut cfg = RunConfig::new(model, prompt);
    cfg.chat = args.chat;
    cfg.chat_template = template_file(args)?;
    cfg.n_predict = args.n_predict;
    cfg.ignore_eos = args.ignore_eos;
    if let Some(t) = args.threads {
        cfg.threads = t;
    }
    cfg.n_ctx = args.ctx;
    cfg.mode = mode_of(args);
    cfg.stream_explicit = args.stream.moe_stream;
    cfg.telemetry.csv = args.csv.clone();
    cfg.telemetry.progress = args.progress;
    cfg.n_expert_used = args.n_expert_used;
    cfg.speculation = engine::SpecConfig {
        source: speculation_of(args),
        draft_max: args.draft,
        gated: args.spec.is_some(),
    };
    cfg.ubatch = args.ubatch;
    cfg.sampling = sampling;
    cfg.stop = args.sampling.stop.clone();
    cfg.rpc = args.rpc.config();
    cfg.model_id_memo = bmoe::fixture::cache_dir().ok().map(|d| d.join("model-ids"));
    cfg.route_from = args.route_from.clone();
    Ok(cfg)
}

/// Resident, or streamed with the cache and I/O flags.
fn mode_of(args: &RunArgs) -> Mode {
    if args.resident {
        Mode::Resident
    } else {
        Mode::Stream(args.stream.config())
    }
}

/// N-gram or MTP speculation, both (`--spec auto`), or none (--ngram wins
/// over --mtp; `--spec` names one of them, gated).
fn speculation_of(args: &RunArgs) -> engine::Speculation {
    let min_match = args
        .ngram_min_match
        .unwrap_or(bmoe_decode::ngram::DEFAULT_MIN_MATCH as u32);
    if args.spec == Some(crate::cli::SpecSource::Auto) {
        return engine::Speculation::Auto {
            min_match,
            p_min: args.mtp_p_min.unwrap_or(0.0),
            predemand: args.head_predemand,
            head: true,
        };
    }
    match (args.uses_ngram(), args.uses_mtp()) {
        (true, _) => engine::Speculation::Ngram { min_match },
        (false, true) => engine::Speculation::Mtp {
            p_min: args.mtp_p_min.unwrap_or(0.0),
            predemand: args.head_predemand,
        },
        (false, false) => engine::Speculation::Off,
    }
}

/// Write the `BMOE_DONE` line: to stdout with --progress, unless stdout is
/// what failed; to stderr otherwise.
fn done(progress: bool, line: &str) -> Result<()> {
    if progress && bmoe::stdio::stdout_failed().is_none() {
        outln!("BMOE_DONE {line}");
    } else {
        bmoe::say!();
        bmoe::say!("BMOE_DONE {line}");
    }
    Ok(())
}

/// The engine's error as the user reads it: a refusal as it is (a prompt too
/// long for the context also says how llama.cpp sized it), anything else
/// with the model as context. The exit code is the binary's one mapping.
fn explained(
    res: Result<RunReport, EngineError>,
    args: &RunArgs,
    model: &Path,
) -> Result<RunReport> {
    match res {
        Ok(r) => Ok(r),
        Err(e @ EngineError::Generate(GenerateError::PromptTooLong { n_ctx, .. })) => {
            let note = ctx_rounding(args.ctx, n_ctx);
            Err(Noted { source: e, note }.into())
        }
        Err(e) if e.is_refusal() => Err(e.into()),
        Err(e) => Err(anyhow::Error::new(e).context(format!("run {}", model.display()))),
    }
}

/// An engine error with a note after its message (the error stays the cause,
/// so its exit code is the engine error's).
#[derive(Debug, thiserror::Error)]
#[error("{source}{note}")]
struct Noted {
    source: EngineError,
    note: String,
}

/// What llama.cpp made of `-c` (it rounds the context up to a multiple of
/// 256), when that differs from what was asked.
fn ctx_rounding(requested: u32, settled: u32) -> String {
    if settled == requested {
        return String::new();
    }
    format!(" (-c {requested} was rounded up to {settled}: llama.cpp sizes contexts in multiples of 256)")
}

/// `--chat-template-file`: the template's text (a clear error for a file
/// that cannot be read or is not UTF-8).
pub(super) fn template_file(args: &RunArgs) -> Result<Option<String>, UsageError> {
    let Some(path) = &args.chat_template_file else {
        return Ok(None);
    };
    checks::read_text_file("the --chat-template-file", path, "").map(Some)
}

/// `--show-prompt`: the prompt as the model would get it (only the
/// vocabulary loaded), its token count on stderr; nothing generated. A
/// prompt a run would refuse (empty, or too long for `-c`) is refused here
/// too, with the same error.
fn show_prompt(cfg: &RunConfig) -> Result<()> {
    let params = llama::ModelParams {
        vocab_only: true,
        ..llama::ModelParams::default()
    };
    let model = llama::Model::load(&cfg.model, &params)?;
    let (text, tokens) = if cfg.chat {
        let template = ChatTemplate::of(&model, cfg.chat_template.as_deref());
        let (rendered, tokens) = template.user_prompt(&model, &cfg.prompt)?;
        (rendered.text, tokens.len())
    } else {
        let tokens = model.tokenize(&cfg.prompt, true, false)?;
        (cfg.prompt.clone(), tokens.len())
    };
    if tokens == 0 {
        return Err(EngineError::Generate(GenerateError::EmptyPrompt).into());
    }
    bmoe::stdio::out(&text)?;
    bmoe::say!("({tokens} prompt tokens)");
    // llama.cpp sizes a run's context in multiples of 256 (see `ctx_rounding`).
    let n_ctx = cfg.n_ctx.next_multiple_of(256);
    if tokens >= n_ctx as usize {
        let e = EngineError::Generate(GenerateError::PromptTooLong {
            prompt_tokens: tokens,
            n_ctx,
        });
        let note = ctx_rounding(cfg.n_ctx, n_ctx);
        return Err(Noted { source: e, note }.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// `bmoe run -p x` with no other flag runs [`RunConfig::new`]'s defaults:
    /// the numbers `--help` shows are the engine's own (the one addition,
    /// where the model's hash is remembered, is bmoe's cache folder).
    #[test]
    fn a_run_without_flags_is_the_engines_default_run() {
        let args = crate::cli::parse_run(&["bmoe", "run", "-p", "x"]);
        let model = std::path::PathBuf::from("m.gguf");
        let cfg = super::run_config(&args, model.clone(), "x".into()).expect("a config");
        let mut default = super::RunConfig::new(model, "x".into());
        default.model_id_memo = bmoe::fixture::cache_dir().ok().map(|d| d.join("model-ids"));
        assert_eq!(format!("{cfg:?}"), format!("{default:?}"));
    }
}
