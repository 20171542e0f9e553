//! What `bmoe run` settles before generating: the mode, the speculation, the
//! batch sizes, and the resolved configuration as the CSV preamble.

use std::path::PathBuf;

use bmoe_decode::telemetry::TelemetryConfig;

use super::error::EngineError;
use super::mode::{Asked, Mode};
use super::note::Note;
use super::prefill::{TARGET_UBATCH, UBATCH_MIN};
use super::refusal::Refusal;
use crate::layout::MoeLayout;
use crate::stream::{StreamError, Streamer};

/// The MTP draft context's physical batch (its compute buffer scales with
/// n_ubatch x vocab; the drafts are a few tokens wide).
pub const MTP_UBATCH: u32 = 32;
/// The widest `--draft`.
pub const MAX_DRAFT: u32 = 8;
/// `-n`'s default: tokens to generate.
pub const DEFAULT_N_PREDICT: u32 = 128;
/// `-c`'s default: the context size in tokens.
pub const DEFAULT_N_CTX: u32 = 2048;
/// `--draft`'s default: drafts verified per decode with speculation.
pub const DEFAULT_DRAFT: u32 = 3;
// A verify batch ([last, d1..dN]) must fit one ubatch of each context, and a
// hybrid target needs n_ubatch >= n_rs_seq (= the draft width) + 2. Neither
// width is a setting, so this is checked here rather than refused at load.
const _: () = assert!(MAX_DRAFT + 2 <= MTP_UBATCH && MAX_DRAFT + 2 <= TARGET_UBATCH);
// A verify batch fits the smallest `--ubatch` too.
const _: () = assert!(MAX_DRAFT + 2 <= UBATCH_MIN);

/// Self-speculative decoding: where drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Speculation {
    #[default]
    Off,
    /// `--ngram`: the longest earlier match of the corpus's suffix.
    Ngram { min_match: u32 },
    /// `--mtp`: the model's own MTP (nextn) head; it stops drafting once its
    /// confidence falls below `p_min`. When streaming, `predemand` reads the
    /// drafting pass's experts in the background during the verify decode
    /// (`--head-predemand`; off by default: on the 2-core test host it cost the
    /// verify decode about what it saved the head, docs/speculation.md).
    Mtp { p_min: f32, predemand: bool },
    /// `--spec auto`: n-gram drafts when the matcher has a match, the MTP
    /// head's otherwise (`head`: the model has one), always behind the gate.
    Auto {
        min_match: u32,
        p_min: f32,
        predemand: bool,
        head: bool,
    },
}

impl Speculation {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Speculation::Off => "off",
            Speculation::Ngram { .. } => "ngram",
            Speculation::Mtp { .. } => "mtp",
            Speculation::Auto { .. } => "auto",
        }
    }

    /// The MTP head's settings (p_min, predemand) when this drafts with it.
    pub(crate) fn head(self) -> Option<(f32, bool)> {
        match self {
            Speculation::Mtp { p_min, predemand }
            | Speculation::Auto {
                p_min,
                predemand,
                head: true,
                ..
            } => Some((p_min, predemand)),
            _ => None,
        }
    }

    /// The n-gram matcher's shortest match when this drafts with it.
    pub(crate) fn ngram(self) -> Option<u32> {
        match self {
            Speculation::Ngram { min_match } | Speculation::Auto { min_match, .. } => {
                Some(min_match)
            }
            _ => None,
        }
    }

    /// `--spec auto` on this model: with the head only if it has one.
    pub(crate) fn for_model(self, layout: &MoeLayout) -> Self {
        match self {
            Speculation::Auto {
                min_match,
                p_min,
                predemand,
                ..
            } => Speculation::Auto {
                min_match,
                p_min,
                predemand,
                head: layout.n_layer_nextn > 0,
            },
            s => s,
        }
    }
}

/// Speculation's settings, together: where drafts come from, how many a
/// decode verifies, and whether the gate chooses that number each step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecConfig {
    pub source: Speculation,
    /// `--draft`: drafts verified per decode (the most, when gated).
    pub draft_max: u32,
    /// `--spec`: the speculation gate chooses each step how many drafts to
    /// verify (bmoe-decode `spec_gate`); `--ngram`/`--mtp` verify them all.
    /// `--spec auto` mixes its sources through the gate, so is always gated.
    pub gated: bool,
}

impl Default for SpecConfig {
    /// No speculation, `--draft`'s default width kept for when it is turned on.
    fn default() -> Self {
        SpecConfig {
            source: Speculation::Off,
            draft_max: DEFAULT_DRAFT,
            gated: false,
        }
    }
}

impl SpecConfig {
    /// Whether drafts are made at all.
    pub fn is_on(&self) -> bool {
        self.source != Speculation::Off
    }

    /// Drafts verified per decode at most: 0 without speculation.
    pub fn width(&self) -> u32 {
        if self.is_on() {
            self.draft_max
        } else {
            0
        }
    }
}

/// Everything `bmoe run` settles before generating.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub model: PathBuf,
    /// What to generate: the prompt and the per-job options.
    pub job: JobConfig,
    /// A Jinja chat template to use instead of the model file's own.
    pub chat_template: Option<String>,
    pub threads: u32,
    pub n_ctx: u32,
    /// Resident, streamed, or bmoe's choice (the CLI's when no streaming
    /// flag was given: resident when the model file fits, see [`super::fits`]).
    pub mode: Asked,
    /// `--csv` and `--progress`.
    pub telemetry: TelemetryConfig,
    /// `--n-expert-used K`: route each token to K experts instead of the
    /// model's own count (lossy unless K equals it).
    pub n_expert_used: Option<u32>,
    /// Speculation: the draft source, width and gate (`--ngram`, `--mtp`,
    /// `--spec`, `--draft`).
    pub speculation: SpecConfig,
    /// `--ubatch`: the prompt's micro-batch (auto: the whole prompt when it fits).
    pub ubatch: super::prefill::Ubatch,
    /// `--rpc`: the last layers on llama.cpp RPC hosts.
    pub rpc: Option<super::rpc_config::RpcConfig>,
    /// Prompt states kept on disk and how the model file is named for them.
    pub prompt_states: PromptStates,
    /// `--route-from TRACE`: every row's routing replaced by the trace's
    /// (the text is meaningless by design).
    pub route_from: Option<PathBuf>,
}

/// One generation's prompt and options: what `bmoe run` hands the engine
/// beside its configuration.
#[derive(Debug, Clone)]
pub struct JobConfig {
    pub prompt: String,
    /// Render `prompt` as a user message through the chat template.
    pub chat: bool,
    pub n_predict: u32,
    /// `--ignore-eos`: never stop at the end of text.
    pub ignore_eos: bool,
    /// `--temp` and the other sampling flags (greedy by default).
    pub sampling: bmoe_decode::sampling::SamplingParams,
    /// `--stop`: text that ends generation.
    pub stop: Vec<String>,
}

/// Where prompt states are kept.
#[derive(Debug, Clone, Default)]
pub struct PromptStates {
    /// `bmoe run --prompt-cache-file FILE`: the prompt's state restored and saved.
    pub file: Option<PathBuf>,
    /// Where a model file's whole-file hash (what names its prompt-cache
    /// states) is remembered once computed (None: hashed at each use).
    pub model_id_memo: Option<PathBuf>,
}

impl RunConfig {
    /// A run of `prompt` on `model` with every other setting at its default
    /// (the defaults `bmoe run`'s flags show): streamed with
    /// [`crate::stream::StreamConfig::default`], greedy, no speculation, all
    /// cores. Callers set the fields they change.
    pub fn new(model: PathBuf, prompt: String) -> Self {
        RunConfig {
            model,
            job: JobConfig {
                prompt,
                chat: false,
                n_predict: DEFAULT_N_PREDICT,
                ignore_eos: false,
                sampling: Default::default(),
                stop: Vec::new(),
            },
            chat_template: None,
            threads: crate::llama::default_threads(),
            n_ctx: DEFAULT_N_CTX,
            mode: Asked::StreamMoe(crate::stream::StreamConfig::default()),
            telemetry: TelemetryConfig {
                csv: None,
                progress: false,
                channel_capacity: bmoe_decode::telemetry::CHANNEL_CAPACITY,
            },
            n_expert_used: None,
            speculation: SpecConfig::default(),
            ubatch: super::prefill::Ubatch::Auto,
            rpc: None,
            prompt_states: PromptStates::default(),
            route_from: None,
        }
    }
}

impl RunConfig {
    /// This configuration for the model it runs: `--spec auto` drafts with
    /// the MTP head only where the model has one.
    pub(crate) fn for_model(&self, layout: &MoeLayout) -> RunConfig {
        RunConfig {
            speculation: SpecConfig {
                source: self.speculation.source.for_model(layout),
                ..self.speculation
            },
            ..self.clone()
        }
    }

    /// Experts routed per token, after `--n-expert-used`.
    pub(crate) fn experts_used(&self, layout: &MoeLayout) -> u32 {
        self.n_expert_used.unwrap_or(layout.n_expert_used)
    }

    /// Whether a knob that changes the output is on.
    pub(crate) fn lossy(&self, layout: &MoeLayout) -> bool {
        let drop = self.mode.stream().is_some_and(|sc| sc.drop_cold > 0.0);
        drop || self.route_from.is_some() || self.experts_used(layout) != layout.n_expert_used
    }
}

impl RunConfig {
    /// The checks that need the model's layout (flags clap and the CLI checked
    /// already): a streamed mode on a model bmoe cannot stream, `--n-expert-used`
    /// out of range, `--mtp` without a head. Returns the mode to run (a dense
    /// model runs resident) and notes for the summary.
    pub(crate) fn check_against(
        &self,
        layout: &MoeLayout,
    ) -> Result<(Asked, Vec<Note>), EngineError> {
        let mut notes = Vec::new();
        let mut mode = self.mode.clone();
        if mode.stream().is_some() {
            if layout.n_expert > 0 && !layout.is_moe() {
                // It says it has experts, but not in a layout bmoe can stream.
                let seen = match layout.unknown_experts.as_slice() {
                    [] => "none named *exps.weight".to_string(),
                    names => names.join(", "),
                };
                return Err(StreamError::UnknownLayout {
                    model: self.model.display().to_string(),
                    n_expert: layout.n_expert,
                    seen,
                }
                .into());
            }
            if !layout.is_moe() {
                if let Asked::Stream(_) = mode {
                    return Err(StreamError::NotMoe {
                        model: self.model.display().to_string(),
                        n_expert: layout.n_expert,
                    }
                    .into());
                }
                notes.push(Note::DenseResident);
                mode = Asked::Resident;
            }
        }
        if let Some(k) = self.n_expert_used {
            if k == 0 || k > layout.n_expert {
                return Err(Refusal::ExpertsUsed {
                    k,
                    n_expert: layout.n_expert,
                    default_k: layout.n_expert_used,
                }
                .into());
            }
            if layout.hash_layers > 0 && k != layout.n_expert_used {
                // llama.cpp checks the table's shape against the count at load.
                return Err(Refusal::HashRouted {
                    k,
                    arch: layout.arch.clone(),
                    hash_layers: layout.hash_layers,
                    default_k: layout.n_expert_used,
                }
                .into());
            }
        }
        if let Speculation::Auto { head: false, .. } = self.speculation.source {
            notes.push(Note::NgramOnly {
                model: self.model.clone(),
            });
        }
        if let Some((p_min, _)) = self.speculation.source.head() {
            if layout.n_layer_nextn == 0 {
                return Err(Refusal::NoMtpHead {
                    model: self.model.clone(),
                }
                .into());
            }
            if !(p_min.is_finite() && (0.0..=1.0).contains(&p_min)) {
                return Err(Refusal::MtpPMin { p_min }.into());
            }
        }
        Ok((mode, notes))
    }
}

/// What the CSV preamble says about a streamed run's reader, from its streamer.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ReaderFacts {
    pub(super) budget_bytes: u64,
    pub(super) o_direct: bool,
    pub(super) reader: String,
}

impl ReaderFacts {
    pub(super) fn of(s: &Streamer) -> Self {
        Self {
            budget_bytes: s.budget_bytes,
            o_direct: s.flash.o_direct(),
            reader: s.flash.reader_description().to_string(),
        }
    }
}

/// The context's facts the preamble states: the model's layers, the
/// context and the prompt's micro-batch, in tokens.
#[derive(Debug, Clone, Copy)]
pub(super) struct ContextFacts {
    pub(super) n_layer: u32,
    pub(super) n_ctx: u32,
    pub(super) n_ubatch: u32,
}

/// The resolved configuration, as `key=value` pairs for the CSV preamble: a
/// pure function of the configuration, the layout, the streamer's reader
/// (None when resident), the model's layer count and the context size.
pub(super) fn preamble(
    cfg: &RunConfig,
    layout: &MoeLayout,
    streamer: Option<&ReaderFacts>,
    ctx: ContextFacts,
) -> Vec<(String, String)> {
    let ContextFacts {
        n_layer,
        n_ctx,
        n_ubatch,
    } = ctx;
    let mut v: Vec<(String, String)> = Vec::new();
    let mut kv = |k: &str, val: String| v.push((k.to_string(), val));
    kv("engine_version", crate::VERSION.to_string());
    kv("model", cfg.model.display().to_string());
    kv("arch", layout.arch.clone());
    kv("n_layer", n_layer.to_string());
    kv("n_layer_nextn", layout.n_layer_nextn.to_string());
    kv("n_expert", layout.n_expert.to_string());
    kv("n_expert_used", cfg.experts_used(layout).to_string());
    kv("n_expert_used_model", layout.n_expert_used.to_string());
    kv("threads", cfg.threads.to_string());
    kv("n_ctx", n_ctx.to_string());
    kv("n_ubatch", n_ubatch.to_string());
    kv("n_predict", cfg.job.n_predict.to_string());
    kv("ignore_eos", (cfg.job.ignore_eos as u8).to_string());
    kv("chat", (cfg.job.chat as u8).to_string());
    // The mode that ran: a streamed mode without a streamer (a dense model) ran resident.
    let ran = match (cfg.mode.stream(), streamer) {
        (Some(sc), Some(s)) => Mode::Stream((sc, s)),
        _ => Mode::Resident,
    };
    kv("mode", ran.name().into());
    match ran {
        Mode::Stream((sc, s)) => {
            kv("cache_mb", (s.budget_bytes / (1024 * 1024)).to_string());
            kv("io_threads", sc.io_threads.to_string());
            kv("o_direct", (s.o_direct as u8).to_string());
            kv("reader", s.reader.clone());
            kv("overlap", (sc.overlap as u8).to_string());
            kv("dense_weights", sc.dense.name().to_string());
        }
        Mode::Resident => {
            kv("cache_mb", "0".into());
            kv("io_threads", "0".into());
            kv("o_direct", "0".into());
            kv("overlap", "0".into());
            kv("dense_weights", "mmap".into());
        }
    }
    let (prefetch, predict, drop) = match ran {
        Mode::Stream((sc, _)) => (sc.prefetch, sc.predict_prefetch, sc.drop_cold),
        Mode::Resident => (0, false, 0.0),
    };
    kv("prefetch", prefetch.to_string());
    kv("predict_prefetch", (predict as u8).to_string());
    kv("drop_cold_frac", drop.to_string());
    kv("lossy", (cfg.lossy(layout) as u8).to_string());
    kv("spec", cfg.speculation.source.name().into());
    let gated = cfg.speculation.gated && cfg.speculation.is_on();
    kv("spec_gate", (gated as u8).to_string());
    kv("temp", cfg.job.sampling.temperature.to_string());
    kv("seed", cfg.job.sampling.seed.to_string());
    let s = cfg.speculation.source;
    let draft_max = cfg.speculation.width();
    let min_match = s.ngram().unwrap_or(0);
    let (p_min, predemand) = s.head().unwrap_or((0.0, false));
    kv("spec_draft_max", draft_max.to_string());
    kv("ngram_min_match", min_match.to_string());
    kv("mtp_p_min", p_min.to_string());
    let predemand = predemand && streamer.is_some();
    kv("mtp_head_predemand", (predemand as u8).to_string());
    v
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
