//! Plain greedy generation on one context: the resident path that streaming and
//! speculation are compared against.

use std::time::{Duration, Instant};

use bmoe_actors::sampling::argmax;
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
}

impl Generation {
    /// Decode rate over the generated tokens (the first comes from the prefill).
    pub fn decode_tok_per_s(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        if n == 0 || self.decode.is_zero() {
            return 0.0;
        }
        n as f64 / self.decode.as_secs_f64()
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
}

/// Receives generated text and per-decode timing.
pub trait GenerationSink {
    /// Complete text, as soon as it is known.
    fn text(&mut self, _piece: &str) {}
    /// A decode finished.
    fn decoded(&mut self, _step: DecodeStep) {}
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

/// Greedy generation of up to `n_predict` tokens after `prompt`; `sink` gets each
/// complete piece of text as soon as it is known and each decode's timing.
pub fn generate(
    ctx: &mut Context,
    prompt: &[Token],
    n_predict: u32,
    n_batch: usize,
    sink: &mut dyn GenerationSink,
) -> Result<Generation, GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let n_ctx = ctx.n_ctx();
    if prompt.len() >= n_ctx as usize {
        return Err(GenerateError::PromptTooLong {
            prompt_tokens: prompt.len(),
            n_ctx,
        });
    }
    let model = ctx.model().clone();
    let n_batch = n_batch.clamp(1, ctx.n_batch().max(1) as usize);
    let mut batch = Batch::new(n_batch);
    let t0 = Instant::now();
    let mut pos = 0i32;
    for (ci, chunk) in prompt.chunks(n_batch).enumerate() {
        batch.clear();
        let last_chunk = (ci + 1) * n_batch >= prompt.len();
        for (i, &t) in chunk.iter().enumerate() {
            batch.push(t, pos, last_chunk && i + 1 == chunk.len());
            pos += 1;
        }
        let td = Instant::now();
        tracing::debug_span!("verify.decode", pos, rows = batch.len(), prefill = true)
            .in_scope(|| ctx.decode(&batch))?;
        sink.decoded(DecodeStep {
            n_tokens: batch.len(),
            prefill: true,
            elapsed: td.elapsed(),
        });
    }
    let mut last_row = (batch.len() - 1) as i32;
    let prefill = t0.elapsed();
    let t1 = Instant::now();
    let mut tokens = Vec::new();
    let mut utf8 = Utf8Stream::new();
    let mut text = String::new();
    let stop = loop {
        let logits = ctx.logits(last_row).ok_or(GenerateError::NoLogits)?;
        let next = argmax(logits).ok_or(GenerateError::NoLogits)? as Token;
        if model.is_eog(next) {
            break StopReason::EndOfText;
        }
        tokens.push(next);
        let piece = utf8.push(&model.token_bytes(next));
        if !piece.is_empty() {
            sink.text(&piece);
            text.push_str(&piece);
        }
        if tokens.len() >= n_predict as usize {
            break StopReason::Limit;
        }
        if pos as u32 >= n_ctx {
            break StopReason::ContextFull;
        }
        if sink.should_stop() {
            break StopReason::Interrupted;
        }
        batch.clear();
        batch.push(next, pos, true);
        pos += 1;
        let td = Instant::now();
        tracing::debug_span!("verify.decode", pos, rows = 1usize, prefill = false)
            .in_scope(|| ctx.decode(&batch))?;
        sink.decoded(DecodeStep {
            n_tokens: 1,
            prefill: false,
            elapsed: td.elapsed(),
        });
        last_row = 0;
    };
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
    })
}
