//! A running streamer: the flash actor started over the model's files, the
//! cache budget, and what the verify and draft hooks are built from.

pub(super) mod hooks;
mod mapping;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use bmoe_flash::cache::SlotKey;
use bmoe_flash::warm_profile::ModelShape;
use bmoe_flash::{open_faulty_reader, FaultCounts, Flash, FlashConfig};
use bmoe_output::PendingFile;

use super::files::{shard_files, specs};
use super::memory::{self, FileMapping};
use super::{
    budget::AutoTerms, budget::HEADROOM_BYTES, budget::MIB, cache_warm, cache_warm::WarmSession,
    cache_warm::WarmSource, config::resolve_cache_bytes, config::CacheSize, config::StreamConfig,
    error::StreamError, note::StreamNote, predict::Predictor, trace,
};
use crate::layout::MoeLayout;

/// A running streamer: the flash actor plus what the verify hook needs.
pub(crate) struct Streamer {
    pub(crate) flash: Flash,
    pub(crate) budget_bytes: u64,
    pub(crate) notes: Vec<StreamNote>,
    layout: MoeLayout,
    /// Per file of the model: its mappings that existed before llama.cpp loaded it.
    premapped: Vec<Vec<usize>>,
    /// Experts routed per token (after `--n-expert-used`).
    k: u32,
    predictor: Option<Arc<Predictor>>,
    drop_cold: f32,
    /// What `--inject-faults` injected (None without it).
    pub(crate) faults: Option<Arc<FaultCounts>>,
    /// `--inject-faults observer_panic_at=N` (0: off).
    observer_panic_at: u64,
    /// `--route-trace`: the writer, until the verify hook takes it, and the
    /// file it writes, until the run's end moves it into place.
    route_trace: Mutex<Option<trace::RouteTraceWriter>>,
    route_trace_file: Mutex<Option<PendingFile>>,
    /// `--cache-warm` (None when off), from [`Streamer::start_warm`].
    warm: Option<WarmSession>,
    model_path: PathBuf,
    /// The model's shape and identity (read from its files once, on first use).
    shape: OnceLock<ModelShape>,
}

impl Streamer {
    /// Start the flash actor for `layout` of `model_path`.
    pub(crate) fn start(
        model_path: &Path,
        layout: &MoeLayout,
        cfg: &StreamConfig,
        k: u32,
    ) -> Result<Self, StreamError> {
        if !layout.is_moe() {
            return Err(StreamError::NotMoe {
                model: model_path.display().to_string(),
                n_expert: layout.n_expert,
            });
        }
        let budget_bytes = resolve_cache_bytes(cfg, layout, memory::mem_available_bytes())?;
        let (flash, faults) =
            spawn_flash(model_path, layout, cfg, flash_config(cfg, k, budget_bytes))?;
        let notes = flash
            .notes()
            .iter()
            .cloned()
            .map(StreamNote::Reader)
            .collect();
        let (route_trace, route_trace_file) = match &cfg.route_trace {
            Some(p) => {
                let (w, f) = trace::create(p, trace::header(model_path, layout, k))?;
                (Some(w), Some(f))
            }
            None => (None, None),
        };
        let predictor = if cfg.predict_prefetch {
            Some(Arc::new(Predictor::load(model_path, layout, k)?))
        } else {
            None
        };
        Ok(Self {
            flash,
            budget_bytes,
            notes,
            layout: layout.clone(),
            premapped: premapped(layout),
            k,
            predictor,
            drop_cold: cfg.drop_cold,
            faults,
            observer_panic_at: cfg.faults.as_ref().map_or(0, |p| p.observer_panic_at),
            route_trace: Mutex::new(route_trace),
            route_trace_file: Mutex::new(route_trace_file),
            warm: None,
            model_path: model_path.to_path_buf(),
            shape: OnceLock::new(),
        })
    }

    /// `--cache-warm`, once the budget is settled: find the profile and queue
    /// its hottest slots for the flash actor (read while the prompt is
    /// prefilled, after every demand).
    pub(crate) fn start_warm(&mut self, cfg: &StreamConfig) -> Result<(), StreamError> {
        if cfg.warm == WarmSource::Off {
            return Ok(());
        }
        let shape = self.shape()?.clone();
        if let Some((session, plan)) =
            WarmSession::open(&cfg.warm, &self.model_path, shape, self.budget_bytes)?
        {
            let empty = plan.keys.is_empty() && plan.rates.is_empty();
            if !empty && !self.flash.warm(plan.keys, plan.rates) {
                self.notes.push(StreamNote::WarmBusy);
            }
            self.warm = Some(session);
        }
        Ok(())
    }

    /// The model's shape as the flash actor counts it, and its identity
    /// (`cache_warm::model_shape`: the files' sizes and first bytes, the
    /// expert map), read once.
    pub(crate) fn shape(&self) -> Result<&ModelShape, StreamError> {
        if let Some(s) = self.shape.get() {
            return Ok(s);
        }
        let s = cache_warm::model_shape(&self.layout, self.k)?;
        Ok(self.shape.get_or_init(|| s))
    }

    /// The expert slots resident now, layer-major (for a later start of
    /// this model to read back, [`Self::warm_slots`]).
    pub(crate) fn resident_slots(&self) -> Vec<SlotKey> {
        self.flash.resident_slots()
    }

    /// Queue `slots` of this model for the flash actor to read when idle,
    /// into free budget only; the number queued (0: the actor's queue full).
    /// Slots outside the model's expert map are left out.
    pub(crate) fn warm_slots(&self, slots: Vec<SlotKey>) -> Result<usize, StreamError> {
        let shape = self.shape()?;
        let keys: Vec<SlotKey> = slots
            .into_iter()
            .filter(|k| {
                (k.expert < shape.n_expert)
                    && shape
                        .slot_bytes
                        .get(k.layer as usize)
                        .is_some_and(|&b| b > 0)
            })
            .collect();
        let n = keys.len();
        Ok(if n > 0 && self.flash.warm(keys, Vec::new()) {
            n
        } else {
            0
        })
    }

    /// `--cache-warm`: the summary line, and the profile saved with this
    /// run's routing (a failed save is said, not fatal). None when off.
    pub(crate) fn finish_warm(&self) -> Option<(String, String)> {
        let session = self.warm.as_ref()?;
        let c = self.flash.counters();
        let saved = session
            .save(c)
            .unwrap_or_else(|e| format!("profile not saved: {e}"));
        Some((session.line(c), saved))
    }

    /// Move the `--route-trace` file into place (the verify hook, and with it
    /// the writer, must be gone: every decode it saw is flushed). Returns
    /// where it is; None without `--route-trace`.
    pub(crate) fn commit_route_trace(&self) -> Result<Option<PathBuf>, StreamError> {
        let pending = self.route_trace_file.lock().ok().and_then(|mut f| f.take());
        pending.map(trace::commit).transpose()
    }

    /// `--cache-mb auto`, once the model and every context exist: the budget
    /// the host can spare (see [`AutoTerms`]), given the contexts' estimated
    /// compute buffers. Returns how it was resolved (None for a fixed size).
    pub(crate) fn settle_auto(&mut self, cfg: &StreamConfig, compute: u64) -> Option<AutoTerms> {
        if cfg.cache != CacheSize::Auto {
            return None;
        }
        let terms = AutoTerms {
            available: memory::mem_available_bytes().unwrap_or(u64::MAX),
            dense: self.layout.dense_bytes(),
            compute,
            headroom: HEADROOM_BYTES,
            reserved: cfg.reserved_bytes,
            ceiling: cfg.cache_ceil_mb.map(|mb| mb.saturating_mul(MIB)),
            experts: self.layout.expert_bytes(),
        };
        self.budget_bytes = terms.bytes();
        self.flash.set_budget(self.budget_bytes);
        Some(terms)
    }
}

impl Streamer {
    /// `moe-pretouch:` what the toucher gave the misses (None when it was off).
    pub(crate) fn pretouch_line(&self) -> Option<String> {
        let c = self.flash.counters();
        let ld = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let (moved, none) = (ld(&c.touch.touched_bytes), ld(&c.touch.touch_misses));
        (moved + none > 0).then(|| {
            format!(
                "moe-pretouch: {:.1} MiB of new slots read into pages backed ahead \
                 ({:.1} MiB backed), {none} slices found none ready; {} page faults in the reads",
                moved as f64 / MIB as f64,
                ld(&c.touch.pretouched_bytes) as f64 / MIB as f64,
                ld(&c.touch.read_faults)
            )
        })
    }
}

/// The flash actor's settings from the streaming flags and the budget.
fn flash_config(cfg: &StreamConfig, k: u32, budget_bytes: u64) -> FlashConfig {
    FlashConfig {
        budget_bytes,
        queue_depth: cfg.io_threads,
        o_direct: cfg.o_direct,
        prefetch_layers: cfg.prefetch,
        prefetch_max_experts: k,
        policy: cfg.policy,
        pretouch_bytes: cfg.pretouch_bytes,
        ..FlashConfig::default()
    }
}

/// The flash actor over the model's files; with `--inject-faults`, over a
/// faulty reader of the (single) file, whose counts come back with it.
fn spawn_flash(
    model_path: &Path,
    layout: &MoeLayout,
    cfg: &StreamConfig,
    flash_cfg: FlashConfig,
) -> Result<(Flash, Option<Arc<FaultCounts>>), StreamError> {
    let Some(plan) = &cfg.faults else {
        return Ok((
            Flash::spawn(&shard_files(layout), specs(layout), flash_cfg)?,
            None,
        ));
    };
    if layout.is_split() {
        return Err(StreamError::FaultsOnSplit);
    }
    let max_slice = layout
        .experts
        .iter()
        .map(|e| e.slice_bytes)
        .max()
        .unwrap_or(0);
    let f = open_faulty_reader(model_path, plan, cfg.io_threads, max_slice)?;
    let flash = Flash::spawn_with_reader(
        f.reader,
        vec![f.note],
        specs(layout),
        flash_cfg,
        &[model_path],
    )?;
    Ok((flash, Some(f.counts)))
}

/// Per file of the model: the bases of its mappings that exist now (before
/// llama.cpp loads it).
fn premapped(layout: &MoeLayout) -> Vec<Vec<usize>> {
    layout
        .shards
        .iter()
        .map(|s| FileMapping::existing_bases(&s.path))
        .collect()
}
