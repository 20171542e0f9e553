//! Why a generation failed.

use crate::chat::TemplateError;
use crate::llama::{LlamaError, ObserverFailure};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Llama(#[from] LlamaError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("the prompt is empty: it has no tokens (give text with -p/--prompt or -f/--file; with a chat template, one that renders the conversation as text)")]
    EmptyPrompt,
    #[error("the prompt has {prompt_tokens} tokens but the context holds {n_ctx}; raise -c/--ctx or shorten the prompt")]
    PromptTooLong { prompt_tokens: usize, n_ctx: u32 },
    #[error("llama.cpp returned no logits for the last position")]
    NoLogits,
    #[error("the model computed NaN for the next token's scores: its tensor data is likely corrupt; check the file against its published checksum, or download it again")]
    NanLogits,
    #[error("could not trim the rejected drafts from the KV cache at position {pos}")]
    Rollback { pos: i32 },
    #[error("drafts are verified against greedy picks on a prompt prefilled from its start: speculation needs temperature 0 and no reused prefix")]
    DraftNeedsGreedy,
    #[error("drafts are verified against the target's own argmax, which a grammar does not constrain: a constrained generation runs without speculation")]
    DraftWithGrammar,
    #[error("the output grammar allows no token here (none of the vocabulary's tokens continues it, or it is complete and the end of text is banned)")]
    GrammarDeadEnd,
    #[error("a drafter that reads the target's hidden states (the MTP head, the speculation gate) drafts for one sequence alone: speculate without parallel sequences, or with plain --ngram")]
    DraftNeedsOneSequence,
    #[error("every sequence of the context is generating")]
    NoFreeSequence,
    #[error("MTP draft actor: {0}")]
    DraftActor(#[from] DraftActorError),
}

/// Why the MTP draft actor answered a call without what it asked for.
#[derive(Debug, thiserror::Error)]
pub enum DraftActorError {
    #[error("the draft actor stopped")]
    Stopped,
    /// The head's hook aborted its decode and kept the first error: that,
    /// not llama.cpp's status code, is the cause.
    #[error("the MTP head's expert streaming failed: {0}")]
    HeadStreaming(#[source] ObserverFailure),
    /// A call after the actor's first failure, which that call's reply carried.
    #[error("it failed earlier and answers no more calls")]
    FailedEarlier,
}
