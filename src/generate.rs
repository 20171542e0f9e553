//! Plain greedy generation on one context: the resident path that streaming and
//! speculation are compared against.

use std::time::{Duration, Instant};

use bmoe_actors::sampling::{argmax, argmax_where};
use bmoe_actors::text::Utf8Stream;

use crate::llama::{Batch, ChatMessage, Context, LlamaError, Model, Token};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Llama(#[from] LlamaError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt_tokens} tokens but the context holds {n_ctx}; raise -c/--ctx or shorten the prompt")]
    PromptTooLong { prompt_tokens: usize, n_ctx: u32 },
    #[error("llama.cpp returned no logits for the last position")]
    NoLogits,
    #[error("could not trim the rejected drafts from the KV cache at position {pos}")]
    Rollback { pos: i32 },
    #[error("MTP draft actor: {0}")]
    DraftActor(String),
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfText,
    /// `-n` tokens were generated.
    Limit,
    /// The context is full.
    ContextFull,
    /// The sink asked to stop (an interrupt).
    Interrupted,
}

/// The outcome of one generation.
#[derive(Debug, Clone)]
pub struct Generation {
    pub prompt_tokens: usize,
    /// Generated tokens (an end-of-generation token is not included).
    pub tokens: Vec<Token>,
    pub text: String,
    pub stop: StopReason,
    pub prefill: Duration,
    pub decode: Duration,
    /// Speculation counters (all zero without a drafter).
    pub spec: SpecStats,
}

/// What speculation did over one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecStats {
    /// Decode steps after the prefill (plain or verify).
    pub steps: u64,
    /// Steps whose drafter proposed at least one token (verify decodes).
    pub drafted_steps: u64,
    /// Draft tokens proposed, and how many the target's argmax confirmed.
    pub drafted: u64,
    pub accepted: u64,
    /// Time spent drafting, the drafter's catch-up on each verify step included.
    pub draft: Duration,
}

/// A source of draft tokens for the verify loop. The hooks other than
/// [`draft`](Self::draft) let a source that reads the target's hidden states
/// (the MTP head) follow every target decode; they default to nothing.
pub trait Drafter {
    /// The source's name (`ngram`, `mtp`), for spans.
    fn name(&self) -> &'static str {
        "draft"
    }
    /// Up to `max` tokens to verify after `corpus` (the prompt and every
    /// confirmed token; its last token is the one about to be decoded, at
    /// position `corpus.len() - 1`). An empty draft takes the plain
    /// single-token path.
    fn draft(&mut self, corpus: &[Token], max: usize) -> Result<Vec<Token>, GenerateError>;
    /// The target decoded `batch`: a prefill chunk, or the kept rows of a
    /// verify batch (`[last, d1..dk]`, the rejected tail already cut off).
    fn decoded(&mut self, _batch: &Batch) -> Result<(), GenerateError> {
        Ok(())
    }
    /// The prompt is in the target's cache.
    fn begin(&mut self, _prompt: &[Token]) -> Result<(), GenerateError> {
        Ok(())
    }
    /// The verify step kept `accepted` of `drafted` drafts; the target's cache
    /// now ends before position `n_past` (the next token goes there).
    fn accepted(
        &mut self,
        _drafted: usize,
        _accepted: usize,
        _n_past: i32,
    ) -> Result<(), GenerateError> {
        Ok(())
    }
}

/// The MTP drafter (`--mtp`): the model's own nextn head on a draft context.
pub struct MtpDrafter {
    head: crate::llama::MtpHead,
}

impl MtpDrafter {
    pub fn new(head: crate::llama::MtpHead) -> Self {
        Self { head }
    }
}

impl Drafter for MtpDrafter {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn draft(&mut self, corpus: &[Token], max: usize) -> Result<Vec<Token>, GenerateError> {
        let n_past = corpus.len() as i32 - 1;
        let last = *corpus.last().ok_or(GenerateError::EmptyPrompt)?;
        let d = self.head.draft(n_past, last, corpus, max)?;
        // Positions in the draft context only move forward: drop what the
        // drafting pass put after the last confirmed token.
        self.head.trim_draft(n_past);
        Ok(d)
    }

    fn decoded(&mut self, batch: &Batch) -> Result<(), GenerateError> {
        Ok(self.head.process(batch)?)
    }

    fn begin(&mut self, prompt: &[Token]) -> Result<(), GenerateError> {
        Ok(self.head.begin(prompt)?)
    }

    fn accepted(
        &mut self,
        drafted: usize,
        accepted: usize,
        n_past: i32,
    ) -> Result<(), GenerateError> {
        if drafted > 0 {
            self.head.accept(accepted)?;
        }
        self.head.trim_draft(n_past);
        Ok(())
    }
}

/// The n-gram drafter (`--ngram`): the pure matcher of `bmoe_actors::ngram`.
#[derive(Debug, Clone)]
pub struct NgramDrafter {
    pub min_match: usize,
    pub max_match: usize,
    /// The corpus as the matcher's ids (grown as tokens are confirmed).
    ids: Vec<u32>,
}

impl NgramDrafter {
    pub fn new(min_match: usize) -> Self {
        Self {
            min_match,
            max_match: bmoe_actors::ngram::DEFAULT_MAX_MATCH,
            ids: Vec::new(),
        }
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn draft(&mut self, corpus: &[Token], max: usize) -> Result<Vec<Token>, GenerateError> {
        // The corpus only grows (rejected drafts never enter it): convert the new tail.
        if self.ids.len() > corpus.len() {
            self.ids.clear();
        }
        let from = self.ids.len();
        self.ids.extend(corpus[from..].iter().map(|&t| t as u32));
        let cfg = bmoe_actors::ngram::NgramConfig {
            min_match: self.min_match,
            max_match: self.max_match,
            max_draft: max,
        };
        Ok(bmoe_actors::ngram::draft(&self.ids, &cfg)
            .map(|d| d.tokens.into_iter().map(|t| t as Token).collect())
            .unwrap_or_default())
    }
}

/// One `llama_decode` call as seen by a [`GenerationSink`].
#[derive(Debug, Clone, Copy)]
pub struct DecodeStep {
    /// Tokens in the batch.
    pub n_tokens: usize,
    /// Part of the prompt prefill (the last prefill decode yields the first token).
    pub prefill: bool,
    pub elapsed: Duration,
    /// Speculation: time spent drafting this decode's batch (zero otherwise).
    pub draft: Duration,
}

/// Receives generated text and per-decode timing.
pub trait GenerationSink {
    /// Complete text, as soon as it is known.
    fn text(&mut self, _piece: &str) {}
    /// A decode finished.
    fn decoded(&mut self, _step: DecodeStep) {}
    /// The same decode produced one more token (speculation accepted a draft):
    /// the text that follows belongs to a new token.
    fn next_token(&mut self) {}
    /// Checked at every token boundary: true stops generation there.
    fn should_stop(&mut self) -> bool {
        false
    }
}

impl<F: FnMut(&str)> GenerationSink for F {
    fn text(&mut self, piece: &str) {
        self(piece)
    }
}

/// Turn user text into prompt tokens, through the model's chat template when `chat`.
pub fn prompt_tokens(model: &Model, text: &str, chat: bool) -> Result<Vec<Token>, GenerateError> {
    let tokens = if chat {
        let formatted = model.apply_chat_template(&[ChatMessage {
            role: "user".into(),
            content: text.into(),
        }])?;
        model.tokenize(&formatted, true, true)?
    } else {
        model.tokenize(text, true, false)?
    };
    if tokens.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    Ok(tokens)
}

/// When generation stops: after `n_predict` tokens, or earlier at the end of
/// text unless `ignore_eos` (then end-of-generation tokens are never chosen:
/// the greedy pick is the best other token, as llama.cpp's `--ignore-eos` does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub n_predict: u32,
    pub ignore_eos: bool,
}

impl From<u32> for Limit {
    fn from(n_predict: u32) -> Self {
        Self {
            n_predict,
            ignore_eos: false,
        }
    }
}

/// Greedy generation of up to `limit` tokens after `prompt`; `sink` gets each
/// complete piece of text as soon as it is known and each decode's timing.
pub fn generate(
    ctx: &mut Context,
    prompt: &[Token],
    limit: impl Into<Limit>,
    n_batch: usize,
    sink: &mut dyn GenerationSink,
) -> Result<Generation, GenerateError> {
    generate_with(ctx, prompt, limit, n_batch, sink, None, 0)
}

/// [`generate`] with an optional drafter: each step drafts up to `draft_max`
/// tokens, decodes [last, d1..dN] in one batch with logits on every row, keeps
/// the longest prefix of drafts equal to the target's own argmax plus the
/// target's next token, and trims the rejected tail from the KV cache. A step
/// with no draft is exactly the plain single-token decode.
pub fn generate_with(
    ctx: &mut Context,
    prompt: &[Token],
    limit: impl Into<Limit>,
    n_batch: usize,
    sink: &mut dyn GenerationSink,
    mut drafter: Option<&mut dyn Drafter>,
    draft_max: usize,
) -> Result<Generation, GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let Limit {
        n_predict,
        ignore_eos,
    } = limit.into();
    let n_ctx = ctx.n_ctx();
    if prompt.len() >= n_ctx as usize {
        return Err(GenerateError::PromptTooLong {
            prompt_tokens: prompt.len(),
            n_ctx,
        });
    }
    let model = ctx.model().clone();
    let greedy = Greedy::new(&model, ignore_eos);
    let n_batch = n_batch.clamp(1, ctx.n_batch().max(1) as usize);
    let mut batch = Batch::new(n_batch);
    let t0 = Instant::now();
    if !prefill(ctx, prompt, &mut batch, sink, drafter.as_deref_mut())? {
        return Ok(Generation {
            prompt_tokens: prompt.len(),
            tokens: Vec::new(),
            text: String::new(),
            stop: StopReason::Interrupted,
            prefill: t0.elapsed(),
            decode: Duration::ZERO,
            spec: SpecStats::default(),
        });
    }
    let mut pos = prompt.len() as i32;
    if let Some(d) = drafter.as_deref_mut() {
        d.begin(prompt)?;
    }
    let prefill = t0.elapsed();
    let t1 = Instant::now();
    let mut tokens = Vec::new();
    let mut utf8 = Utf8Stream::new();
    let mut text = String::new();
    let mut spec = SpecStats::default();
    let mut catch_up = Duration::ZERO;
    // The prompt and every confirmed token (the drafters' corpus).
    let mut corpus: Vec<Token> = prompt.to_vec();
    // Tokens the last decode determined, in order (more than one when drafts
    // were accepted); the first comes from the prefill's last row.
    let mut ready: Vec<Token> = vec![greedy.pick(ctx, (batch.len() - 1) as i32)?];
    let stop = 'gen: loop {
        for (i, t) in std::mem::take(&mut ready).into_iter().enumerate() {
            if i > 0 {
                sink.next_token();
            }
            if model.is_eog(t) {
                break 'gen StopReason::EndOfText;
            }
            tokens.push(t);
            corpus.push(t);
            let piece = utf8.push(&model.token_bytes(t));
            if !piece.is_empty() {
                sink.text(&piece);
                text.push_str(&piece);
            }
            if tokens.len() >= n_predict as usize {
                break 'gen StopReason::Limit;
            }
        }
        if pos as u32 >= n_ctx {
            break StopReason::ContextFull;
        }
        if sink.should_stop() {
            break StopReason::Interrupted;
        }
        let last = *tokens.last().ok_or(GenerateError::NoLogits)?;
        // At most what still fits in -n and in the context, after `last`.
        let room = draft_max
            .min(n_predict as usize - tokens.len() - 1)
            .min(n_ctx as usize - pos as usize - 1)
            .min(n_batch - 1);
        let tdraft = Instant::now();
        let mut draft = match drafter.as_deref_mut() {
            Some(d) if room > 0 => {
                tracing::debug_span!("draft", source = d.name(), pos, max = room)
                    .in_scope(|| d.draft(&corpus, room))?
            }
            _ => Vec::new(),
        };
        draft.truncate(room);
        // Drafting cost of this step: the drafting call, plus the drafter's
        // catch-up on the previous verify step (the MTP head's own decode).
        let draft_time = tdraft.elapsed() + std::mem::take(&mut catch_up);
        batch.clear();
        batch.push(last, pos, true);
        for (i, &d) in draft.iter().enumerate() {
            batch.push(d, pos + 1 + i as i32, true);
        }
        let td = Instant::now();
        let decoded =
            tracing::debug_span!("verify.decode", pos, rows = batch.len(), prefill = false)
                .in_scope(|| ctx.decode(&batch));
        if let Err(LlamaError::Interrupted) = decoded {
            break StopReason::Interrupted;
        }
        decoded?;
        sink.decoded(DecodeStep {
            n_tokens: batch.len(),
            prefill: false,
            elapsed: td.elapsed(),
            draft: draft_time,
        });
        spec.steps += 1;
        spec.draft += draft_time;
        // Accept the longest prefix of drafts that equals the target's argmax,
        // then the target's own token after it.
        let mut accepted = 0usize;
        loop {
            let t = greedy.pick(ctx, accepted as i32)?;
            ready.push(t);
            if accepted < draft.len() && draft[accepted] == t {
                accepted += 1;
            } else {
                break;
            }
        }
        debug_assert!(
            ready
                .iter()
                .enumerate()
                .all(|(i, &t)| greedy.pick(ctx, i as i32).ok() == Some(t)),
            "every kept token is the argmax of the verify row that produced it"
        );
        pos += 1 + accepted as i32;
        if !draft.is_empty() {
            spec.drafted_steps += 1;
            spec.drafted += draft.len() as u64;
            spec.accepted += accepted as u64;
            if accepted < draft.len() && !ctx.trim(pos, -1) {
                return Err(GenerateError::Rollback { pos });
            }
        }
        if let Some(d) = drafter.as_deref_mut() {
            // The drafter catches up on the kept rows only ([last, d1..dk]), so it
            // never holds a rejected tail to drop.
            let tc = Instant::now();
            batch.truncate(1 + accepted);
            d.decoded(&batch)?;
            d.accepted(draft.len(), accepted, pos)?;
            catch_up = tc.elapsed();
        }
    };
    // The last step's catch-up belongs to no later decode; it is still drafting cost.
    spec.draft += catch_up;
    let rest = utf8.finish();
    if !rest.is_empty() {
        sink.text(&rest);
        text.push_str(&rest);
    }
    Ok(Generation {
        prompt_tokens: prompt.len(),
        tokens,
        text,
        stop,
        prefill,
        decode: t1.elapsed(),
        spec,
    })
}

/// Decode the prompt in batches of `batch`'s capacity, logits on its last
/// row only. Returns false when a signal or a failed output stopped it
/// (between batches, or inside one through the context's abort callback).
fn prefill<'d>(
    ctx: &mut Context,
    prompt: &[Token],
    batch: &mut Batch,
    sink: &mut dyn GenerationSink,
    mut drafter: Option<&mut (dyn Drafter + 'd)>,
) -> Result<bool, GenerateError> {
    let n_batch = batch.capacity();
    let mut pos = 0i32;
    for (ci, chunk) in prompt.chunks(n_batch).enumerate() {
        if sink.should_stop() {
            return Ok(false);
        }
        batch.clear();
        let last_chunk = (ci + 1) * n_batch >= prompt.len();
        for (i, &t) in chunk.iter().enumerate() {
            batch.push(t, pos, last_chunk && i + 1 == chunk.len());
            pos += 1;
        }
        let td = Instant::now();
        let decoded =
            tracing::debug_span!("verify.decode", pos, rows = batch.len(), prefill = true)
                .in_scope(|| ctx.decode(batch));
        match decoded {
            Err(LlamaError::Interrupted) => return Ok(false),
            r => r?,
        }
        sink.decoded(DecodeStep {
            n_tokens: batch.len(),
            prefill: true,
            elapsed: td.elapsed(),
            draft: Duration::ZERO,
        });
        if let Some(d) = drafter.as_deref_mut() {
            d.decoded(batch)?;
        }
    }
    Ok(true)
}

/// The greedy choice from a row of logits, never an end-of-generation token
/// under `--ignore-eos`.
struct Greedy {
    /// End-of-generation tokens, sorted (empty unless they are banned).
    banned: Vec<Token>,
}

impl Greedy {
    fn new(model: &Model, ignore_eos: bool) -> Self {
        let banned = if ignore_eos {
            (0..model.n_vocab() as Token)
                .filter(|&t| model.is_eog(t))
                .collect()
        } else {
            Vec::new()
        };
        Self { banned }
    }

    /// The argmax of logits row `i` of the last decode (among allowed tokens).
    fn pick(&self, ctx: &Context, i: i32) -> Result<Token, GenerateError> {
        let logits = ctx.logits(i).ok_or(GenerateError::NoLogits)?;
        let best = argmax(logits).ok_or(GenerateError::NoLogits)? as Token;
        if self.banned.binary_search(&best).is_err() {
            return Ok(best);
        }
        // Rare: the best token ends generation; take the best allowed one.
        argmax_where(logits, |t| {
            self.banned.binary_search(&(t as Token)).is_err()
        })
        .map(|t| t as Token)
        .ok_or(GenerateError::NoLogits)
    }
}
