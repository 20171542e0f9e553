//! Generation on one context (the resident path that streaming and
//! speculation are compared against), with optional drafts verified by the
//! target: the types here, the one loop in `multi` (its step in `step`, one
//! generation's part in `sequence`), one generation through it in `verify`,
//! the draft sources in `drafter`.

//!
//! This file is the room's face: its modules and what other rooms name. The
//! files of the room import each other by path, never through this face.

mod drafter;
mod emit;
mod error;
mod gated;
mod multi;
mod outcome;
mod picker;
mod sequence;
mod step;
mod verify;

use crate::chat::ChatTemplate;
use crate::llama::{Context, Model, Token};

pub use drafter::{Accepted, Drafted, Drafter, Follow, MtpDrafter, NgramDrafter};
pub use error::{DraftActorError, GenerateError};
pub use gated::{GatedDrafter, Sources};
pub(crate) use multi::{common_prefix, Finished, Multi, Step};
pub use outcome::{
    DecodeStep, GateStats, GateStep, Generation, GenerationSink, Limit, Options, SpecStats,
    StopReason,
};
pub(crate) use sequence::Request;
pub use verify::{generate_opts, generate_with};

/// Turn user text into prompt tokens: as one user message through `template`
/// when given (the path `bmoe chat` and `serve` take), else as plain text.
pub fn prompt_tokens(
    model: &Model,
    text: &str,
    template: Option<&ChatTemplate>,
) -> Result<Vec<Token>, GenerateError> {
    let tokens = if let Some(template) = template {
        template.user_prompt(model, text)?.1
    } else {
        model.tokenize(text, true, false)?
    };
    if tokens.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    Ok(tokens)
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
