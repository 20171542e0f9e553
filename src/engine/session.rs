//! A model loaded once for many generations (`bmoe chat`, `bmoe serve`): one
//! context whose KV cache keeps the previous turn's tokens, so a prompt that
//! shares their prefix decodes only the rest, and whose expert cache stays warm.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bmoe_decode::metrics::DecodeMetrics;

use super::assemble::{self, Assembly, Backend, Loaded, Prompt};
use super::config::{RunConfig, Speculation};
use super::error::EngineError;
use super::note::Note;
use super::prompt_state;
use super::refusal::Refusal;
use crate::chat::ChatTemplate;
use crate::generate::{self, common_prefix, DecodeStep, Generation, GenerationSink, Options};
use crate::llama::{Context, Model, Target, Token};
use crate::prompt_cache::{self, Ident};

/// The loaded model and its one context. Fields drop in order: the context
/// (and the verify hook with it) before the model and the streamer.
pub struct Session {
    ctx: Context,
    model: Arc<Model>,
    backend: Backend,
    /// The tokens whose KV entries the context holds, from position 0.
    kv: Vec<Token>,
    ubatch: u32,
    /// What loading decided (cache size, context rounding), for the caller to show.
    pub notes: Vec<Note>,
    /// Every turn's figures added up.
    pub totals: TurnFigures,
    /// `--chat-template-file`'s template (None: the model's own).
    template_source: Option<String>,
    /// `--rpc`'s hosts: a NaN names them too.
    rpc: Option<super::rpc_config::RpcConfig>,
    /// `--ngram`: each greedy turn drafts from its own prompt and reply.
    ngram: Option<NgramSpec>,
}

/// The n-gram drafts a session's turns take: the shortest match that may
/// draft and the drafts verified per decode.
#[derive(Debug, Clone, Copy)]
struct NgramSpec {
    min_match: u32,
    draft_max: u32,
}

impl NgramSpec {
    /// `--ngram` (ungated); the gate and the MTP head are run's alone.
    fn of(cfg: &RunConfig) -> Option<Self> {
        match cfg.speculation.source {
            Speculation::Ngram { min_match } if !cfg.speculation.gated => Some(Self {
                min_match,
                draft_max: cfg.speculation.draft_max,
            }),
            _ => None,
        }
    }
}

/// What one turn (or a session's turns together) decoded and read.
#[derive(Debug, Clone, Default)]
pub struct TurnFigures {
    pub turns: u64,
    /// Prompt tokens whose KV entries were reused, and those decoded.
    pub reused_tokens: u64,
    pub prefilled_tokens: u64,
    pub generated_tokens: u64,
    pub(crate) prefill: Duration,
    pub(crate) decode: Duration,
    /// The decodes' streaming counters (zeros when resident).
    pub(crate) metrics: DecodeMetrics,
    /// N-gram drafts proposed and those the target's argmax confirmed.
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
}

impl TurnFigures {
    /// Generated tokens per second of decoding.
    pub fn decode_tok_s(&self) -> f64 {
        let s = self.decode.as_secs_f64();
        if s > 0.0 {
            self.generated_tokens as f64 / s
        } else {
            0.0
        }
    }

    /// Expert cache hits among hits and misses, in percent (None when nothing streamed).
    pub fn hit_pct(&self) -> Option<f64> {
        bmoe_decode::metrics::hit_pct(self.metrics.hits, self.metrics.misses)
    }

    /// Streamed MiB per generated token.
    pub fn mib_per_token(&self) -> f64 {
        self.metrics.read_bytes as f64 / (1 << 20) as f64 / self.generated_tokens.max(1) as f64
    }

    fn add(&mut self, o: &TurnFigures) {
        self.turns += o.turns;
        self.reused_tokens += o.reused_tokens;
        self.prefilled_tokens += o.prefilled_tokens;
        self.generated_tokens += o.generated_tokens;
        self.prefill += o.prefill;
        self.decode += o.decode;
        self.metrics.add(o.metrics.clone());
        self.drafted_tokens += o.drafted_tokens;
        self.accepted_tokens += o.accepted_tokens;
    }
}

/// One turn's generation and figures.
#[derive(Debug, Clone)]
pub struct Turn {
    pub generation: Generation,
    pub figures: TurnFigures,
}

impl Session {
    /// Load `cfg.model` as `run` would (its prompt, `-n`, speculation and
    /// telemetry are not used: each turn brings its own).
    pub fn open(cfg: &RunConfig) -> Result<Self, EngineError> {
        Self::open_seqs(cfg, 1)
    }

    /// [`Self::open`] with a context of `n_seq` sequences, each of `-c`
    /// positions, for generations side by side ([`generate::Multi`]).
    pub(crate) fn open_seqs(cfg: &RunConfig, n_seq: u32) -> Result<Self, EngineError> {
        let ngram = NgramSpec::of(cfg);
        let mut cfg = cfg.clone();
        cfg.speculation.source = Speculation::Off;
        let Assembly { ctx, mut loaded } = assemble::assemble(&cfg, Prompt::Longest, n_seq)?;
        loaded.settle(false)?;
        let Loaded {
            model,
            backend,
            notes,
            prefill,
            cfg,
            ..
        } = loaded;
        let template = ChatTemplate::of(&model, cfg.chat_template.as_deref());
        let mut notes = notes;
        if !template.has_jinja() {
            notes.push(Note::NoChatTemplate {
                model: cfg.model.clone(),
            });
        }
        Ok(Self {
            ctx,
            model,
            backend,
            kv: Vec::new(),
            ubatch: prefill.ubatch,
            notes,
            totals: TurnFigures::default(),
            template_source: cfg.chat_template,
            rpc: cfg.rpc,
            ngram,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The chat template turns are rendered with: `--chat-template-file`'s,
    /// else the model's own.
    pub fn chat_template(&self) -> ChatTemplate {
        ChatTemplate::of(&self.model, self.template_source.as_deref())
    }

    /// The context's size in tokens (prompt and reply together).
    pub fn n_ctx(&self) -> u32 {
        self.ctx.n_ctx()
    }

    /// Whether experts stream (false: resident).
    pub(crate) fn streamed(&self) -> bool {
        self.backend.streamer().is_some()
    }

    /// The identity the expert slots of this model are kept under (None
    /// when experts do not stream).
    pub(crate) fn expert_identity(&self) -> Option<Result<u64, EngineError>> {
        let s = self.backend.streamer()?;
        Some(
            s.shape()
                .map(|shape| shape.identity)
                .map_err(EngineError::from),
        )
    }

    /// The expert slots resident now, named by [`Self::expert_identity`]
    /// (None when experts do not stream), for a later start to read back.
    pub(crate) fn expert_set(&self) -> Option<Result<prompt_cache::ExpertSet, EngineError>> {
        let s = self.backend.streamer()?;
        Some(self.expert_identity()?.map(|identity| {
            prompt_cache::ExpertSet {
                identity,
                slots: s
                    .resident_slots()
                    .iter()
                    .map(|k| (k.layer, k.expert))
                    .collect(),
            }
        }))
    }

    /// Queue `set`'s slots (this model's: read by [`Self::expert_identity`])
    /// for the flash actor to read in the background, into free budget
    /// only; how many were queued (0: resident experts, or the actor busy).
    pub(crate) fn warm_experts(&self, set: &prompt_cache::ExpertSet) -> Result<usize, EngineError> {
        let Some(s) = self.backend.streamer() else {
            return Ok(0);
        };
        let keys = set
            .slots
            .iter()
            .map(|&(layer, expert)| bmoe_flash::cache::SlotKey { layer, expert })
            .collect();
        Ok(s.warm_slots(keys)?)
    }

    /// The context and its micro-batch, for generations side by side
    /// ([`generate::Multi`]); record their figures with [`Self::record`].
    pub(crate) fn context(&mut self) -> (&mut Context, usize) {
        (&mut self.ctx, self.ubatch as usize)
    }

    /// Add figures of generations run through [`Self::context`] to the totals.
    pub(crate) fn record(&mut self, figures: &TurnFigures) {
        self.totals.add(figures);
    }

    /// How many of `prompt`'s first tokens the KV cache holds now.
    pub(crate) fn reusable(&self, prompt: &[Token]) -> usize {
        common_prefix(&self.kv, prompt)
    }

    /// End the session: the context goes first, then `--cache-warm` folds the
    /// session's routing into the profile. The lines to show (none without
    /// a warm profile).
    pub fn close(self) -> Vec<String> {
        let Session { ctx, backend, .. } = self;
        drop(ctx);
        backend
            .streamer()
            .and_then(|s| s.finish_warm())
            .map(|(line, saved)| vec![line, format!("moe-cache-warm: {saved}")])
            .unwrap_or_default()
    }

    /// What names the KV states this session writes and accepts (`cfg` is
    /// the one it was opened with): the model file, `-c`, the KV streams of a
    /// state, the settings that change the KV values, the bmoe version.
    pub fn state_ident(&self, cfg: &RunConfig) -> std::io::Result<Ident> {
        prompt_state::ident_of(cfg, self.n_ctx(), self.ctx.state_streams())
    }

    /// Write the KV entries of the tokens the context holds to `file` (a
    /// prompt cache entry named by `ident`, written beside it and renamed into
    /// place): the tokens saved and the bytes written.
    pub fn save_state(&mut self, file: &Path, ident: &Ident) -> Result<(usize, u64), EngineError> {
        let bytes = prompt_state::write(&mut self.ctx, 0, file, ident, &self.kv)?;
        Ok((self.kv.len(), bytes))
    }

    /// Put the KV state saved in `file` into the context (what
    /// [`Self::save_state`] wrote with the same `ident`): the tokens it holds,
    /// which the next turn's prompt reuses as far as it starts with them. On
    /// an error the context is left empty.
    pub fn restore_state(&mut self, file: &Path, ident: &Ident) -> Result<usize, EngineError> {
        self.reset();
        let entry = prompt_state::read(file, ident).map_err(Refusal::from)?;
        prompt_state::put(&mut self.ctx, 0, &entry.state)?;
        self.kv = entry.tokens;
        Ok(self.kv.len())
    }

    /// Forget the KV cache (the next turn prefills its whole prompt).
    pub fn reset(&mut self) {
        self.kv.clear();
        self.ctx.clear();
    }

    /// `--ngram`'s drafter for a generation under `opts`, whose draft width
    /// it sets. Drafts are checked against greedy picks, which a grammar
    /// does not constrain: a sampled or constrained generation goes without.
    pub(crate) fn drafter_for(&self, opts: &mut Options) -> Option<generate::NgramDrafter> {
        let n = self
            .ngram
            .filter(|_| opts.sampling.is_greedy() && opts.grammar.is_none())?;
        opts.draft_max = n.draft_max as usize;
        Some(generate::NgramDrafter::new(n.min_match as usize))
    }

    /// Generate after `prompt` under `opts` (its `cached` is set here from the
    /// KV cache; its `n_batch` is the session's), reusing the longest prefix
    /// the previous turns left in the KV cache.
    pub fn generate(
        &mut self,
        prompt: &[Token],
        opts: &Options,
        sink: &mut dyn GenerationSink,
    ) -> Result<Turn, EngineError> {
        let cached = self.reusable(prompt);
        let mut opts = Options {
            cached,
            n_batch: self.ubatch as usize,
            ..opts.clone()
        };
        let mut drafter = self.drafter_for(&mut opts);
        let mut metering = Metering {
            inner: sink,
            metrics: DecodeMetrics::default(),
        };
        let t0 = Instant::now();
        let mut target = Target::new(&mut self.ctx);
        let drafter = drafter
            .as_mut()
            .map(|d| d as &mut dyn generate::Drafter<'_>);
        let res = generate::generate_opts(&mut target, prompt, &opts, &mut metering, drafter);
        let g = match res {
            Ok(g) => g,
            Err(e) => {
                // What the KV cache holds after a failed decode is unknown.
                self.reset();
                return Err(super::rpc::blame_hosts(e.into(), self.rpc.as_ref()));
            }
        };
        let reused = cached.min(prompt.len() - 1);
        self.kv = kept_tokens(prompt, reused, &g.tokens);
        let figures = TurnFigures {
            turns: 1,
            reused_tokens: reused as u64,
            prefilled_tokens: (prompt.len() - reused) as u64,
            generated_tokens: g.tokens.len() as u64,
            prefill: g.prefill,
            decode: t0.elapsed().saturating_sub(g.prefill),
            metrics: metering.metrics,
            drafted_tokens: g.spec.drafted,
            accepted_tokens: g.spec.accepted,
        };
        self.totals.add(&figures);
        Ok(Turn {
            generation: g,
            figures,
        })
    }
}

/// The tokens certainly in the KV cache after a generation that reused
/// `reused` prompt tokens: the prompt and every generated token but the last
/// (which was picked, never decoded; after an end of text it was, but one
/// token re-decoded costs little). Nothing generated: the prefill may have
/// been stopped, so only the reused part counts.
fn kept_tokens(prompt: &[Token], reused: usize, generated: &[Token]) -> Vec<Token> {
    let Some((_, decoded)) = generated.split_last() else {
        return prompt[..reused].to_vec();
    };
    let mut kv = prompt.to_vec();
    kv.extend_from_slice(decoded);
    kv
}

/// Passes everything to the caller's sink and adds up the decodes' counters.
struct Metering<'a> {
    inner: &'a mut dyn GenerationSink,
    metrics: DecodeMetrics,
}

impl GenerationSink for Metering<'_> {
    fn text(&mut self, piece: &str) {
        self.inner.text(piece)
    }

    fn decoded(&mut self, step: DecodeStep) {
        self.metrics.add(step.metrics.clone());
        self.inner.decoded(step)
    }

    fn next_token(&mut self) {
        self.inner.next_token()
    }

    fn should_stop(&mut self) -> bool {
        self.inner.should_stop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_generated_token_is_not_counted_as_cached() {
        assert_eq!(kept_tokens(&[1, 2, 3], 1, &[]), vec![1]);
        assert_eq!(kept_tokens(&[1, 2], 0, &[3, 4, 5]), vec![1, 2, 3, 4]);
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
    }
}
