//! `bmoe run`: the prompt and flags checked, the engine run, its text, summary
//! and `BMOE_DONE` line written.

use std::path::{Path, PathBuf};

use anyhow::Result;

use bmoe::chat::ChatTemplate;
use bmoe::engine::{self, EngineError, RunConfig, RunReport};
use bmoe::generate::GenerateError;
use bmoe::llama;

use super::args::RunArgs;
use super::checks::{self, UsageError};
use super::stream::StreamExtras;

/// `bmoe run`: check the arguments, run the engine with its text on stdout,
/// then write the summary and the `BMOE_DONE` line.
pub fn run(args: RunArgs) -> Result<()> {
    let prompt = checked_prompt(&args)?;
    let model = model_of(&args)?;
    let cfg = run_config(&args, model, prompt)?;
    if args.generation.show_prompt {
        return show_prompt(&cfg);
    }
    let progress = args.outputs.progress;
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
    let (gen, outputs) = (&args.generation, &args.outputs);
    if let Some(csv) = outputs.csv.as_deref() {
        checks::output_file("--csv", csv, &inputs)?;
    }
    if let Some(t) = &outputs.route_trace {
        checks::output_file("--route-trace", t, &inputs)?;
    }
    if let Some(f) = &gen.prompt_cache_file {
        // Read, then rewritten; the inputs above never include it (filtering
        // it out of them by path would also let it name the model).
        checks::output_file("--prompt-cache-file", f, &inputs)?;
    }
    if let bmoe::stream::WarmSource::File(f) = &args.streaming.stream.cache_warm {
        // The profile is read, then updated: only the other inputs count.
        let others: Vec<&Path> = inputs.iter().copied().filter(|&i| i != f).collect();
        checks::output_file("--cache-warm", f, &others)?;
    }
    let prompt = match (&gen.prompt, &gen.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => checks::read_prompt_file(f)?,
        (None, None) => {
            return Err(
                UsageError("give a prompt with -p/--prompt TEXT or -f/--file FILE".into()).into(),
            )
        }
    };
    checks::prompt_text(&prompt, gen.chat)?;
    super::model::warn_threads_above_cores(args.model.threads);
    checks::run_args(args)?;
    Ok(prompt)
}

/// The model (-m, or the default fixture prepared), with `--n-expert-used`
/// checked against it.
fn model_of(args: &RunArgs) -> Result<PathBuf> {
    let m = &args.model;
    let model = super::model::model_or_default(&m.model)?;
    if let Some(k) = m.n_expert_used {
        super::graph::check_experts_used(&model, k, m.ctx)?;
    }
    Ok(model)
}

/// The engine's configuration: the shared groups', with run's route trace,
/// then run's generation, output and speculation flags.
pub(super) fn run_config(
    args: &RunArgs,
    model: PathBuf,
    prompt: String,
) -> Result<RunConfig, UsageError> {
    let (gen, outputs) = (&args.generation, &args.outputs);
    let extras = StreamExtras {
        route_trace: outputs.route_trace.clone(),
        reserved_bytes: 0,
    };
    let mut cfg = args
        .shared()
        .engine_config(model, prompt, gen.tokens.n_predict, extras)?;
    cfg.job.chat = gen.chat;
    cfg.job.ignore_eos = gen.ignore_eos;
    cfg.job.stop = gen.stop.clone();
    cfg.prompt_states.file = gen.prompt_cache_file.clone();
    cfg.route_from = gen.route_from.clone();
    cfg.telemetry.csv = outputs.csv.clone();
    cfg.telemetry.progress = outputs.progress;
    cfg.speculation = args.spec.config();
    // --head-predemand reads the head's streamed experts: it streams.
    if args.spec.head_predemand {
        cfg.mode = cfg.mode.always_stream();
    }
    Ok(cfg)
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
            let note = ctx_rounding(args.model.ctx, n_ctx);
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
    let (text, tokens) = if cfg.job.chat {
        let template = ChatTemplate::of(&model, cfg.chat_template.as_deref());
        let (rendered, tokens) = template.user_prompt(&model, &cfg.job.prompt)?;
        (rendered.text, tokens.len())
    } else {
        let tokens = model.tokenize(&cfg.job.prompt, true, false)?;
        (cfg.job.prompt.clone(), tokens.len())
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
    /// the numbers `--help` shows are the engine's own (the additions: where
    /// the model's hash is remembered, bmoe's cache folder; and, no streaming
    /// flag given, resident when the model fits in memory).
    #[test]
    fn a_run_without_flags_is_the_engines_default_run() {
        let args = crate::cli::args::parse_run(&["bmoe", "run", "-p", "x"]);
        let model = std::path::PathBuf::from("m.gguf");
        let cfg = super::run_config(&args, model.clone(), "x".into()).expect("a config");
        let mut default = super::RunConfig::new(model, "x".into());
        default.prompt_states.model_id_memo =
            bmoe::fixture::cache_dir().ok().map(|d| d.join("model-ids"));
        default.mode = bmoe::engine::Asked::Auto(bmoe::stream::StreamConfig::default());
        assert_eq!(format!("{cfg:?}"), format!("{default:?}"));
    }
}
