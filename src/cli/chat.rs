//! `bmoe chat`: a multi-turn terminal chat with line editing and history
//! (rustyline). Each turn decodes only what the KV cache does not hold yet;
//! Ctrl-C stops the reply, Ctrl-D exits; /reset, /stats, /save FILE, /quit.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use rustyline::error::ReadlineError;

use bmoe::chat::{ChatInput, ChatTemplate, Conversation, TemplateError, TemplateOptions};
use bmoe::engine::{RunConfig, Session, TurnFigures};
use bmoe::generate::{Limit, Options, StopReason};
use bmoe::llama::Token;
use bmoe::prompt_cache::Ident;

use super::model::{ModelArgs, Shared};
use super::sampling::SamplingArgs;
use super::stream::{StreamExtras, StreamingArgs};
use super::usage;

#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub streaming: StreamingArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten, next_help_heading = "Chat")]
    pub tokens: super::tokens::TokensArg,
    #[command(flatten)]
    pub spec: super::spec::ChatSpecArgs,
    /// End a reply where this text first appears (left out of the output);
    /// repeat the flag for several.
    #[arg(help_heading = "Chat", long, value_name = "TEXT")]
    pub stop: Vec<String>,
    /// A system prompt that opens the conversation.
    #[arg(
        help_heading = "Chat",
        long,
        value_name = "TEXT",
        conflicts_with = "resume"
    )]
    pub system: Option<String>,
    /// Continue the conversation `/save FILE` wrote: its messages from FILE,
    /// and its KV state from FILE.kv beside it, so the next turn prefills
    /// only its new message (without FILE.kv, or with one of another model
    /// or context, a warning and the conversation is prefilled again).
    #[arg(help_heading = "Chat", long, value_name = "FILE")]
    pub resume: Option<PathBuf>,
}

impl ChatArgs {
    /// The groups chat shares with run and serve.
    pub fn shared(&self) -> Shared<'_> {
        Shared {
            model: &self.model,
            streaming: &self.streaming,
            sampling: &self.sampling,
        }
    }

    /// The engine's configuration: the shared groups', with -n and --stop.
    fn engine_config(&self, model: PathBuf) -> Result<RunConfig, usage::UsageError> {
        let extras = StreamExtras::default();
        let mut cfg =
            self.shared()
                .engine_config(model, String::new(), self.tokens.n_predict, extras)?;
        cfg.job.stop = self.stop.clone();
        cfg.speculation = self.spec.config();
        Ok(cfg)
    }
}

const HELP: &str = "/reset forgets the conversation, /stats shows the last turn's and the session's figures, /save FILE writes the transcript as JSON and its KV state to FILE.kv (bmoe chat --resume FILE continues it), /quit (or Ctrl-D) exits; Ctrl-C stops a reply";

/// `bmoe chat`: load once, then one turn per line until Ctrl-D or /quit.
pub fn chat(args: ChatArgs) -> Result<()> {
    super::model::warn_threads_above_cores(args.model.threads);
    super::model::shared_args(&args.shared())?;
    args.sampling.check_speculation(args.spec.ngram)?;
    let resumed = args.resume.as_deref().map(read_transcript).transpose()?;
    let model = super::model::model_or_default(&args.model.model)?;
    let cfg = args.engine_config(model)?;
    let mut session = Session::open(&cfg)?;
    for note in &session.notes {
        bmoe::say!("{note}");
    }
    let ident = session
        .state_ident(&cfg)
        .inspect_err(|e| {
            bmoe::say!(
                "warning: cannot read {} ({e}): /save writes no KV state",
                cfg.model.display()
            )
        })
        .ok();

    bmoe::say!("bmoe chat: {HELP}");
    let conversation = match (resumed, &args.resume) {
        (Some((saved_model, c)), Some(file)) => {
            resume(
                &mut session,
                ident.as_ref(),
                file,
                &saved_model,
                &cfg.model,
                &c,
            );
            c
        }
        _ => Conversation::new(args.system.clone()),
    };
    let mut chat = Chat {
        template: session.chat_template(),
        conversation,
        ident,
        last: None,
        opts: Options {
            limit: Limit::from(cfg.job.n_predict),
            sampling: cfg.job.sampling.clone(),
            stop: cfg.job.stop.clone(),
            ..Options::default()
        },
        model: cfg.model.clone(),
        inputs: [
            Some(cfg.model.clone()),
            args.model.chat_template_file.clone(),
        ]
        .into_iter()
        .flatten()
        .collect(),
    };
    let read = read_lines(&mut chat, &mut session);
    for line in session.close() {
        bmoe::say!("{line}");
    }
    read
}

/// One turn per line read until Ctrl-D or /quit.
fn read_lines(chat: &mut Chat, session: &mut Session) -> Result<()> {
    let mut editor = rustyline::DefaultEditor::new()?;
    loop {
        let line = match editor.readline("> ") {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            // A line that is not UTF-8 is skipped; the conversation goes on.
            Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                bmoe::say!("(that line is not UTF-8 text: skipped; the conversation goes on)");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(line);
        if !chat.command(line, session)? {
            break;
        }
    }
    Ok(())
}

/// The conversation and what its turns need.
struct Chat {
    template: ChatTemplate,
    conversation: Conversation,
    /// The last turn's figures.
    last: Option<TurnFigures>,
    opts: Options,
    /// The model file (named in a saved transcript; never overwritten by /save).
    model: PathBuf,
    /// The command's input files (the model, `--chat-template-file`): /save
    /// never writes over one.
    inputs: Vec<PathBuf>,
    /// What names the KV state /save writes (None: the model was unreadable).
    ident: Option<Ident>,
}

impl Chat {
    /// A command or a user message; false to exit.
    fn command(&mut self, line: &str, session: &mut Session) -> Result<bool> {
        match line
            .split_once(' ')
            .map_or((line, ""), |(c, rest)| (c, rest.trim()))
        {
            ("/quit" | "/exit", _) => return Ok(false),
            ("/reset", _) => {
                self.conversation.reset();
                session.reset();
                bmoe::say!("(conversation forgotten)");
            }
            ("/stats", _) => self.stats(session),
            ("/save", "") => bmoe::say!("/save needs a file name: /save chat.json"),
            ("/save", file) => self.save(Path::new(file), session),
            ("/help", _) => bmoe::say!("{HELP}"),
            (c, _) if c.starts_with('/') => bmoe::say!("unknown command {c}: {HELP}"),
            _ => self.turn(line, session)?,
        }
        Ok(true)
    }

    /// One turn: the conversation rendered, fitted to the context, decoded
    /// from where the KV cache ends, the reply streamed to stdout.
    fn turn(&mut self, user: &str, session: &mut Session) -> Result<()> {
        self.conversation.push("user", user);
        let fitted = match self.fitted_prompt(session) {
            // Ctrl-C while the template renders stops this reply before
            // its first token, as it would during generation.
            Err(e) if matches!(e.downcast_ref(), Some(TemplateError::Cancelled(_))) => {
                bmoe::interrupt::take();
                bmoe::say!("(reply stopped)");
                self.conversation.push("assistant", "");
                return Ok(());
            }
            other => other?,
        };
        let Some(prompt) = fitted else {
            self.conversation.pop();
            return Ok(());
        };
        let room = session.n_ctx() as usize - prompt.len();
        let opts = Options {
            limit: Limit::from(self.opts.limit.n_predict.min(room as u32)),
            ..self.opts.clone()
        };
        let mut print = |s: &str| {
            let _ = bmoe::stdio::out(s);
        };
        // A Ctrl-C between replies (outside the line editor) is not for this one.
        bmoe::interrupt::take();
        let turn = session.generate(&prompt, &opts, &mut print)?;
        let _ = bmoe::stdio::out("\n");
        match turn.generation.stop {
            StopReason::Interrupted => {
                bmoe::interrupt::take();
                bmoe::say!("(reply stopped)");
            }
            StopReason::Limit | StopReason::ContextFull => bmoe::say!(
                "(reply cut at {} tokens: -n caps each reply, and the context what is left)",
                turn.figures.generated_tokens
            ),
            _ => {}
        }
        self.conversation
            .push("assistant", turn.generation.text.trim());
        self.last = Some(turn.figures);
        Ok(())
    }

    /// The conversation's prompt, oldest turns dropped until it and a
    /// reply's worth of tokens fit the context (None: the newest message
    /// alone does not fit).
    fn fitted_prompt(&mut self, session: &Session) -> Result<Option<Vec<Token>>> {
        let n_ctx = session.n_ctx() as usize;
        let reserve = (self.opts.limit.n_predict as usize).min(n_ctx / 4);
        let mut dropped = 0;
        loop {
            let messages = self.conversation.messages();
            let options = TemplateOptions::new();
            let rendered = self
                .template
                .render(session.model(), &ChatInput::messages(&messages, &options))?;
            let tokens = self.template.tokens(session.model(), &rendered)?;
            if tokens.len() + reserve <= n_ctx {
                if dropped > 0 {
                    bmoe::say!("(context full: dropped the oldest {dropped} turn(s); the rest is prefilled again)");
                }
                return Ok(Some(tokens));
            }
            if !self.conversation.drop_oldest_turn() {
                bmoe::say!(
                    "(that message is {} tokens with the system prompt; the context holds {n_ctx} with {reserve} kept for the reply: shorten it, or restart with a larger -c)",
                    tokens.len()
                );
                return Ok(None);
            }
            dropped += 1;
        }
    }

    fn stats(&self, session: &Session) {
        match &self.last {
            Some(f) => bmoe::say!("last turn: {}", figures_line(f)),
            None => bmoe::say!("last turn: none yet"),
        }
        bmoe::say!(
            "session ({} turns): {}",
            session.totals.turns,
            figures_line(&session.totals)
        );
    }

    fn save(&self, file: &Path, session: &mut Session) {
        let state = state_file(file);
        let inputs: Vec<&Path> = self.inputs.iter().map(PathBuf::as_path).collect();
        for f in [file, state.as_path()] {
            if let Err(e) = usage::output_file("/save", f, &inputs) {
                bmoe::say!("({e})");
                return;
            }
        }
        if file.exists() && read_transcript(file).is_err() {
            bmoe::say!(
                "(/save {}: that file exists and is not a bmoe chat transcript: left as it is; \
                 choose another name)",
                file.display()
            );
            return;
        }
        let json = self.conversation.to_json(&self.model.display().to_string());
        let tmp = file.with_extension("json.partial");
        match std::fs::write(&tmp, json + "\n").and_then(|_| std::fs::rename(&tmp, file)) {
            Ok(()) => bmoe::say!(
                "(saved {} to {}; {})",
                plural(self.conversation.turns(), "turn"),
                file.display(),
                self.save_state(&state, session)
            ),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                bmoe::say!("(could not save to {}: {e})", file.display())
            }
        }
    }
}

impl Chat {
    /// Write the session's KV state to `state`: what happened, for /save's line.
    fn save_state(&self, state: &Path, session: &mut Session) -> String {
        let Some(ident) = &self.ident else {
            return "no KV state saved (the model file was unreadable)".into();
        };
        match session.save_state(state, ident) {
            Ok((tokens, bytes)) => format!(
                "the KV state of its {tokens} tokens to {} ({:.1} MiB)",
                state.display(),
                bytes as f64 / (1u64 << 20) as f64
            ),
            Err(e) => format!("no KV state saved: {e}"),
        }
    }
}

/// Where /save FILE puts the KV state: FILE.kv.
fn state_file(transcript: &Path) -> PathBuf {
    let mut name = transcript.as_os_str().to_owned();
    name.push(".kv");
    PathBuf::from(name)
}

/// The largest transcript `--resume` reads (a longer file is refused, not
/// read until memory runs out).
const MAX_TRANSCRIPT_BYTES: u64 = 64 << 20;

/// `--resume FILE`'s transcript: the model it names and the conversation;
/// a missing, malformed, oversized or non-regular one (a FIFO, a device) is
/// a usage error, found without blocking.
fn read_transcript(file: &Path) -> Result<(String, Conversation)> {
    let refused = |why: String| {
        usage::UsageError(format!(
            "--resume {}: {why} (give a file /save wrote)",
            file.display()
        ))
    };
    let mut bytes = Vec::new();
    bmoe::user_file::open_regular(file)
        .and_then(|f| f.take(MAX_TRANSCRIPT_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| refused(e.to_string()))?;
    if bytes.len() as u64 > MAX_TRANSCRIPT_BYTES {
        return Err(refused(format!(
            "longer than {} MiB, not a bmoe chat transcript",
            MAX_TRANSCRIPT_BYTES >> 20
        ))
        .into());
    }
    let json = String::from_utf8(bytes)
        .map_err(|_| refused("not a bmoe chat transcript (not text)".into()))?;
    Conversation::from_json(&json)
        .map_err(|e| usage::UsageError(format!("--resume {}: {e}", file.display())).into())
}

/// Continue the conversation `c` saved in `file`: its KV state restored from
/// FILE.kv when there is one for this model and context.
fn resume(
    session: &mut Session,
    ident: Option<&Ident>,
    file: &Path,
    saved_model: &str,
    model: &Path,
    c: &Conversation,
) {
    if Path::new(saved_model) != model {
        bmoe::say!(
            "note: {} was saved with {saved_model}; it continues with {}",
            file.display(),
            model.display()
        );
    }
    let turns = plural(c.turns(), "turn");
    let state = state_file(file);
    let restored = match ident {
        _ if !state.exists() => Err(format!("no KV state beside it ({})", state.display())),
        None => Err("the model file was unreadable".into()),
        Some(id) => session.restore_state(&state, id).map_err(|e| e.to_string()),
    };
    match restored {
        Ok(n) => bmoe::say!(
            "(resumed {turns} from {}; {n} tokens of KV state restored from {}: the next turn prefills only its new message)",
            file.display(),
            state.display()
        ),
        Err(why) => bmoe::say!(
            "(resumed {turns} from {}; {why}: the next turn prefills the conversation)",
            file.display()
        ),
    }
}

/// One line of a turn's (or the session's) figures.
fn figures_line(f: &TurnFigures) -> String {
    let hit = f
        .hit_pct()
        .map_or("resident".into(), |h| format!("hit {h:.1}%"));
    format!(
        "prompt {} tokens ({} reused from the KV cache, {} prefilled), {} generated, decode {:.2} tok/s, {hit}, {:.1} MiB/token{}",
        f.reused_tokens + f.prefilled_tokens,
        f.reused_tokens,
        f.prefilled_tokens,
        f.generated_tokens,
        f.decode_tok_s(),
        f.mib_per_token(),
        drafts_part(f)
    )
}

/// ", drafts: A of D accepted" when the turns drafted (`--ngram`).
fn drafts_part(f: &TurnFigures) -> String {
    match f.drafted_tokens {
        0 => String::new(),
        d => format!(", drafts: {} of {d} accepted", f.accepted_tokens),
    }
}

/// "1 turn", "2 turns".
fn plural(n: usize, what: &str) -> String {
    match n {
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
}
