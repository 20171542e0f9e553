//! llama.cpp's sampler chain for sampled (non-greedy) generation: penalties,
//! top-k, top-p, min-p, temperature and a seeded draw, in llama.cpp's own
//! order, applied to a logits row the caller hands in; a grammar, when the
//! request constrains its output, first of all.

use std::ptr::NonNull;

use bmoe_decode::sampling::SamplingParams;
use llama_cpp_sys_2 as sys;

use super::grammar::{Grammar, GrammarSampler};
use super::utf8_guard::Utf8Guard;
use super::{batch::Token, error::LlamaError, model::Model};

/// A sampler chain and the scratch array it works on.
pub(crate) struct Sampler {
    /// The grammar, first in the chain but told only of generated tokens
    /// (the prompt is not grammar text).
    grammar: Option<GrammarSampler>,
    /// Beside a grammar: the tokens that would not continue the reply as
    /// valid UTF-8 are banned (the grammar decodes bytes leniently).
    utf8: Option<Utf8Guard>,
    chain: NonNull<sys::llama_sampler>,
    /// One entry per vocabulary token, refilled from each logits row.
    candidates: Vec<sys::llama_token_data>,
}

impl Sampler {
    /// The chain for `p` over a vocabulary of `n_vocab` tokens (`p` checked by
    /// [`SamplingParams::check`]; a greedy `p` still draws, at temperature 0
    /// llama.cpp's chain picks the argmax).
    pub(crate) fn new(n_vocab: usize, p: &SamplingParams) -> Result<Self, LlamaError> {
        let failed = || LlamaError::Sampler("llama.cpp could not create a sampler".into());
        // SAFETY: plain constructor; the params struct is returned by value.
        let params = unsafe { sys::llama_sampler_chain_default_params() };
        // SAFETY: creates a new chain, owned by the returned Sampler.
        let chain = unsafe { sys::llama_sampler_chain_init(params) };
        let chain = NonNull::new(chain).ok_or_else(failed)?;
        let sampler = Self {
            grammar: None,
            utf8: None,
            chain,
            candidates: Vec::with_capacity(n_vocab),
        };
        for stage in stages(p) {
            let stage = NonNull::new(create(stage, n_vocab, p)).ok_or_else(failed)?;
            // SAFETY: the chain takes ownership of the stage and frees it with
            // itself (in Drop).
            unsafe { sys::llama_sampler_chain_add(sampler.chain.as_ptr(), stage.as_ptr()) };
        }
        Ok(sampler)
    }

    /// The chain for `p` on `model`'s vocabulary with `grammar` first.
    pub(crate) fn with_grammar(
        model: &Model,
        p: &SamplingParams,
        grammar: Option<&Grammar>,
    ) -> Result<Self, LlamaError> {
        let mut s = Self::new(model.n_vocab(), p)?;
        if let Some(g) = grammar {
            s.grammar = Some(GrammarSampler::new(model.vocab(), g)?);
            s.utf8 = Some(Utf8Guard::new(model));
        }
        Ok(s)
    }

    /// Whether a grammar holds the output.
    pub(crate) fn has_grammar(&self) -> bool {
        self.grammar.is_some()
    }

    /// Tell the penalties about a token of the prompt.
    pub(crate) fn accept(&mut self, token: Token) {
        // SAFETY: valid chain; accept only updates its state.
        unsafe { sys::llama_sampler_accept(self.chain.as_ptr(), token) }
    }

    /// Tell the chain and the grammar about a generated token; false when
    /// the grammar could not take it.
    fn accept_generated(&mut self, token: Token) -> bool {
        self.accept(token);
        if let Some(u) = &mut self.utf8 {
            u.accept(token);
        }
        let Some(g) = &self.grammar else {
            return true;
        };
        // SAFETY: a valid grammar sampler; the wrapper catches llama.cpp's
        // exceptions (a token the grammar cannot take) into a status.
        let status = unsafe { sys::llama_rs_sampler_accept(g.as_ptr(), token) };
        status == sys::LLAMA_RS_STATUS_OK
    }

    /// Draw a token from `logits` with every token in `banned` (sorted) left
    /// out, and accept it. `None` when nothing can be drawn.
    pub(crate) fn sample(&mut self, logits: &[f32], banned: &[Token]) -> Option<Token> {
        self.candidates.clear();
        self.candidates.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| sys::llama_token_data {
                    id: i as Token,
                    logit: if banned.binary_search(&(i as Token)).is_ok() {
                        f32::NEG_INFINITY
                    } else {
                        l
                    },
                    p: 0.0,
                }),
        );
        if let Some(u) = &self.utf8 {
            let candidates = &mut self.candidates;
            u.bans(|t| {
                if let Some(c) = candidates.get_mut(t as usize) {
                    c.logit = f32::NEG_INFINITY;
                }
            });
        }
        let mut array = sys::llama_token_data_array {
            data: self.candidates.as_mut_ptr(),
            size: self.candidates.len(),
            selected: -1,
            sorted: false,
        };
        if let Some(g) = &self.grammar {
            // SAFETY: as below: the grammar only sets the logits of tokens it
            // does not allow to -inf.
            unsafe { sys::llama_sampler_apply(g.as_ptr(), &mut array) };
        }
        // SAFETY: `array` points at `self.candidates`, alive and not otherwise
        // borrowed for the call; the chain may reorder and shrink it in place.
        unsafe { sys::llama_sampler_apply(self.chain.as_ptr(), &mut array) };
        let i = usize::try_from(array.selected)
            .ok()
            .filter(|&i| i < array.size)?;
        // SAFETY: `i` is below the size of the array the chain left (its data
        // pointer and size, still within `candidates`).
        let picked = unsafe { *array.data.add(i) };
        // -inf: nothing was allowed (the grammar's and the bans' leftovers).
        if banned.binary_search(&picked.id).is_ok() || picked.logit == f32::NEG_INFINITY {
            return None;
        }
        self.accept_generated(picked.id).then_some(picked.id)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        // SAFETY: the chain was created by `llama_sampler_chain_init`, freed
        // once here with every stage it owns.
        unsafe { sys::llama_sampler_free(self.chain.as_ptr()) }
    }
}

/// One stage of the chain.
#[derive(Debug, Clone, Copy)]
enum Stage {
    Penalties,
    TopK,
    TopP,
    MinP,
    Temperature,
    Draw,
}

/// The chain's stages in llama.cpp's default order: the penalties, top-k,
/// top-p, min-p, temperature, the draw (the ones `p` switches off left out).
fn stages(p: &SamplingParams) -> Vec<Stage> {
    let on = [
        (Stage::Penalties, p.has_penalties()),
        (Stage::TopK, p.top_k > 0),
        (Stage::TopP, p.top_p < 1.0),
        (Stage::MinP, p.min_p > 0.0),
        (Stage::Temperature, true),
        (Stage::Draw, true),
    ];
    on.into_iter()
        .filter(|(_, on)| *on)
        .map(|(s, _)| s)
        .collect()
}

/// A new sampler for `stage` (ownership passes to the caller; null on failure).
fn create(stage: Stage, n_vocab: usize, p: &SamplingParams) -> *mut sys::llama_sampler {
    // SAFETY: plain constructors of new samplers with checked, finite
    // arguments; none keeps a pointer to its arguments.
    unsafe {
        match stage {
            Stage::Penalties => sys::llama_sampler_init_penalties(
                n_vocab as i32,
                p.repeat_last_n as i32,
                p.repeat_penalty,
                p.frequency_penalty,
                p.presence_penalty,
            ),
            Stage::TopK => sys::llama_sampler_init_top_k(p.top_k as i32),
            Stage::TopP => sys::llama_sampler_init_top_p(p.top_p, 1),
            Stage::MinP => sys::llama_sampler_init_min_p(p.min_p, 1),
            Stage::Temperature => sys::llama_sampler_init_temp(p.temperature),
            Stage::Draw => sys::llama_sampler_init_dist(p.seed),
        }
    }
}
