//! The MTP draft actor: the model's nextn head on a thread of its own.
//!
//! The actor owns the draft context (and, when streaming, its eval hook); the
//! verify loop talks to it through [`MtpActor`], a [`Drafter`] whose every call
//! is one request and one reply over bounded channels. Each call lends the
//! target context: the request carries the [`TargetTurn`] taken out of the
//! verify loop's [`Target`] (its exclusive borrow of the context) and the reply
//! brings it back, so the head reads the target's hidden states only while the
//! verify thread waits. The actor's thread is a scoped thread
//! ([`std::thread::scope`]) within the borrow the turns come from, so the
//! compiler checks that the head never holds the target past its life: no
//! lifetime is erased anywhere.
//!
//! What runs concurrently, when the experts stream: once the actor has handed
//! its drafts over, the verify decode runs on the other thread and the actor
//! would be idle until the next call. With `--head-predemand` (off by default:
//! on a 2-core host it measured as a wash) it pre-demands, as the draft requester,
//! the union of the experts its drafting pass routed at the head's layer, as a
//! background request: the flash actor reads them while no demand waits (the
//! verify decode's demands go first), so they are read during the verify
//! decode's compute without delaying its reads, and they are what the head's
//! next call needs first: its catch-up on the kept rows `[last, d1..dk]`
//! feeds the head the same tokens at the same positions as the drafting pass
//! did (the first row with the very same inputs, the others with the target's
//! hidden states in place of the head's own), so it mostly routes to the same
//! experts. The pins of a requester last until its next demand, so the
//! pre-demanded slices stay resident for the catch-up whatever the cache size.
//! The head's hits, stall and pre-demanded bytes are in [`HeadReport`].
//!
//! Shutdown: [`MtpActor::finish`] (or drop) raises the draft context's abort
//! flag, closes the request channel and joins the thread (an aborted decode
//! returns within one graph node); the scope joins it at the latest.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, SendError, Sender};

use bmoe_decode::metrics::DecodeMetrics;
use bmoe_flash::FlashClient;

use crate::generate::{
    Accepted, DraftActorError, Drafted, Drafter, Follow, GenerateError, MtpDrafter,
};
use crate::llama::{
    Batch, Context, ContextKind, ContextParams, LlamaError, Model, MtpHead, Target, TargetTurn,
    Token,
};
use crate::stream::DraftHookParts;

/// Requests queued to the draft actor (the verify loop waits for each reply,
/// so one is in flight at a time; the rest is slack).
pub(crate) const DRAFT_QUEUE_CAPACITY: usize = 4;
/// Replies from the draft actor in flight.
pub(crate) const DRAFT_REPLY_CAPACITY: usize = 1;
/// Capacity of the channel the draft actor reports its start on, once.
const READY_CAPACITY: usize = 1;

#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    #[error(transparent)]
    Llama(#[from] LlamaError),
    #[error("could not start the draft actor thread: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the draft actor stopped before it was ready (it panicked; run with -v for its log)")]
    Died,
}

/// How to build the head on the actor's thread.
pub(crate) struct MtpActorConfig {
    pub(crate) model: Arc<Model>,
    pub(crate) n_ctx: u32,
    pub(crate) n_threads: u32,
    /// The draft context's physical batch.
    pub(crate) n_ubatch: u32,
    /// The largest batch it processes: a prefill micro-batch of the target
    /// (the target's n_batch).
    pub(crate) n_batch: u32,
    /// The most drafts per step (`--draft`).
    pub(crate) draft_max: usize,
    /// `--mtp-p-min`.
    pub(crate) p_min: f32,
    /// The streamed head's hook ingredients (None when resident).
    pub(crate) hook: Option<DraftHookParts>,
    /// Pre-demand the drafting pass's experts during the verify decode.
    pub(crate) predemand: bool,
}

/// What the head's streaming did over a run (zeros when resident).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct HeadReport {
    /// Time the head's decodes waited for expert reads.
    pub(crate) stall: Duration,
    /// The head's demands and their hits/misses (experts of its layer).
    pub(crate) demands: u64,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    /// Pre-demands sent during verify decodes, and the bytes the flash actor
    /// read for them in the background.
    pub(crate) predemands: u64,
    pub(crate) predemand_read_bytes: u64,
}

enum Request {
    Decoded(Vec<(Token, i32, bool)>),
    Begin(Vec<Token>),
    Accepted(Accepted),
    /// Empty the head's cache (the gate rests it).
    Forget,
    /// The corpus grew by `tail`; draft up to `max` tokens after it.
    Draft {
        tail: Vec<Token>,
        max: usize,
    },
}

impl Request {
    /// What the head is told, as a request it owns.
    fn follow(event: Follow<'_>) -> Self {
        match event {
            Follow::Begin(prompt) => Request::Begin(prompt.to_vec()),
            Follow::Decoded(batch) => {
                Request::Decoded((0..batch.len()).filter_map(|i| batch.get(i)).collect())
            }
            Follow::Accepted(step) => Request::Accepted(step),
            Follow::Forget => Request::Forget,
        }
    }
}

/// A request with the target lent for it (the reply brings the turn back).
struct Call<'t> {
    req: Request,
    turn: TargetTurn<'t>,
}

type Reply = Result<Vec<Token>, GenerateError>;

/// What the actor sends back: the reply and the target's turn.
type Answer<'t> = (Reply, TargetTurn<'t>);

/// The verify loop's handle on the draft actor, a thread of `'scope` lent the
/// target borrowed for `'t`.
pub(crate) struct MtpActor<'scope, 't> {
    tx: Option<Sender<Call<'t>>>,
    rx: Receiver<Answer<'t>>,
    join: Option<ScopedJoinHandle<'scope, HeadReport>>,
    abort: Arc<AtomicBool>,
    /// Corpus tokens already sent.
    sent: usize,
    report: Option<HeadReport>,
}

impl<'scope, 't: 'scope> MtpActor<'scope, 't> {
    /// Start the actor on a thread of `scope`: it creates the draft context
    /// and ties the head to `target` before returning (call before the
    /// target's first decode).
    pub(crate) fn spawn<'env>(
        scope: &'scope Scope<'scope, 'env>,
        target: &mut Target<'t>,
        cfg: MtpActorConfig,
    ) -> Result<Self, DraftError> {
        let (tx, req_rx) = bounded::<Call<'t>>(DRAFT_QUEUE_CAPACITY);
        let (reply_tx, rx) = bounded::<Answer<'t>>(DRAFT_REPLY_CAPACITY);
        let (ready_tx, ready_rx) =
            bounded::<(Result<(), LlamaError>, TargetTurn<'t>)>(READY_CAPACITY);
        let abort = Arc::new(AtomicBool::new(false));
        let thread_abort = abort.clone();
        let mut turn = target.lend()?;
        let join = std::thread::Builder::new()
            .name("bmoe-draft".into())
            .spawn_scoped(scope, move || {
                match Actor::new(&mut turn, cfg, thread_abort) {
                    Ok(mut actor) => {
                        let _ = ready_tx.send((Ok(()), turn));
                        actor.run(req_rx, reply_tx)
                    }
                    Err(e) => {
                        let _ = ready_tx.send((Err(e), turn));
                        HeadReport::default()
                    }
                }
            })
            .map_err(DraftError::Spawn)?;
        let ready = match ready_rx.recv() {
            Ok((ready, turn)) => {
                target.restore(turn);
                ready
            }
            Err(_) => {
                let _ = join.join();
                return Err(DraftError::Died);
            }
        };
        match ready {
            Ok(()) => Ok(Self {
                tx: Some(tx),
                rx,
                join: Some(join),
                abort,
                sent: 0,
                report: None,
            }),
            Err(e) => {
                let _ = join.join();
                Err(e.into())
            }
        }
    }
}

impl<'t> MtpActor<'_, 't> {
    /// One request with the target lent for it; returns the actor's reply
    /// once the target is back.
    fn call(&mut self, target: &mut Target<'t>, req: Request) -> Reply {
        let stopped = || GenerateError::from(DraftActorError::Stopped);
        let tx = self.tx.as_ref().ok_or_else(stopped)?;
        let turn = target.lend()?;
        if let Err(SendError(call)) = tx.send(Call { req, turn }) {
            target.restore(call.turn);
            return Err(stopped());
        }
        // An actor that ended holding the turn leaves the target lent: the
        // verify loop's next use of it fails too.
        let (reply, turn) = self.rx.recv().map_err(|_| stopped())?;
        target.restore(turn);
        reply
    }

    /// Stop the actor and return what the head's streaming did.
    pub(crate) fn finish(&mut self) -> HeadReport {
        if let Some(r) = self.report {
            return r;
        }
        self.abort.store(true, Ordering::SeqCst);
        self.tx = None;
        let report = match self.join.take().map(|j| j.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => {
                tracing::error!("the draft actor panicked");
                HeadReport::default()
            }
            None => HeadReport::default(),
        };
        self.report = Some(report);
        report
    }
}

impl Drop for MtpActor<'_, '_> {
    fn drop(&mut self) {
        self.finish();
    }
}

impl<'t> Drafter<'t> for MtpActor<'_, 't> {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn draft(&mut self, target: &mut Target<'t>, corpus: &[Token], max: usize) -> Drafted {
        let from = self.sent.min(corpus.len());
        self.sent = corpus.len();
        let tail = corpus[from..].to_vec();
        self.call(target, Request::Draft { tail, max })
    }

    fn follow(&mut self, target: &mut Target<'t>, event: Follow<'_>) -> Result<(), GenerateError> {
        self.call(target, Request::follow(event)).map(|_| ())
    }
}

/// The actor's state, on its own thread.
struct Actor {
    drafter: MtpDrafter,
    batch: Batch,
    corpus: Vec<Token>,
    /// The pre-demand client (streaming with `--head-predemand` only).
    predemand: Option<FlashClient>,
    /// What the head's streaming cost over the run (routing logs dropped).
    totals: DecodeMetrics,
    /// The experts the last drafting pass routed at the head's layer.
    drafted_experts: Vec<u32>,
    /// The head's layer (n_layer: the block after the trunk).
    layer: u32,
    predemands: u64,
}

impl Actor {
    fn new(
        turn: &mut TargetTurn<'_>,
        cfg: MtpActorConfig,
        abort: Arc<AtomicBool>,
    ) -> Result<Self, LlamaError> {
        let n_batch = cfg.n_batch.max(cfg.n_ubatch);
        let mut params = ContextParams {
            n_ctx: cfg.n_ctx,
            n_batch,
            n_ubatch: cfg.n_ubatch,
            n_threads: cfg.n_threads,
            kind: ContextKind::Mtp,
            abort: Some(abort.clone()),
            ..ContextParams::default()
        };
        let mut predemand = None;
        if let Some(parts) = cfg.hook {
            // The head's experts stream too (requester Draft).
            let (hook, client) = parts.build(abort);
            params.observer = Some(Box::new(hook));
            predemand = cfg.predemand.then_some(client);
        }
        let draft = Context::new(cfg.model.clone(), params)?;
        let head = MtpHead::new(turn, draft, cfg.draft_max, cfg.p_min)?;
        Ok(Self {
            drafter: MtpDrafter::new(head),
            batch: Batch::new(n_batch as usize),
            corpus: Vec::new(),
            predemand,
            totals: DecodeMetrics::default(),
            drafted_experts: Vec::new(),
            layer: cfg.model.n_layer(),
            predemands: 0,
        })
    }

    fn run<'t>(&mut self, rx: Receiver<Call<'t>>, tx: Sender<Answer<'t>>) -> HeadReport {
        // After the first failure every later call is refused (that reply
        // carried the cause), so the actor (and the draft context) is torn
        // down only inside `finish`'s join, never while the verify thread
        // runs on.
        let mut failed = false;
        while let Ok(Call { req, mut turn }) = rx.recv() {
            let drafting = matches!(req, Request::Draft { .. });
            let reply = self.answer(req, &mut turn, failed);
            failed |= reply.is_err();
            if tx.send((reply, turn)).is_err() {
                break;
            }
            if drafting && !failed {
                // The verify decode runs now: read the catch-up's experts meanwhile.
                self.predemand();
            }
        }
        let mut report = HeadReport {
            predemands: self.predemands,
            ..HeadReport::default()
        };
        if let Some(client) = &self.predemand {
            // Only the draft requester asks for background reads.
            report.predemand_read_bytes = client
                .counters()
                .background_read_bytes
                .load(std::sync::atomic::Ordering::Relaxed);
        }
        report.stall = self.totals.stall;
        report.demands = self.totals.demands;
        report.hits = self.totals.hits;
        report.misses = self.totals.misses;
        report
    }

    /// Serve one call (or, after a failure, refuse it), with the target
    /// lent for it (the turn goes back with the reply).
    fn answer(&mut self, req: Request, turn: &mut TargetTurn<'_>, failed: bool) -> Reply {
        let span = tracing::debug_span!("draft.step", source = "mtp", req = req.name());
        let _g = span.enter();
        let drafting = matches!(req, Request::Draft { .. });
        let reply = if failed {
            Err(DraftActorError::FailedEarlier.into())
        } else {
            self.serve(turn, req)
        };
        self.account(drafting);
        // The head's hook aborts its decode on a failed read and keeps the
        // first error: that, not llama.cpp's status code, is the cause.
        match (reply, self.drafter.failure()) {
            (_, Some(e)) => Err(DraftActorError::HeadStreaming(e).into()),
            (r, None) => r,
        }
    }

    fn serve(&mut self, turn: &mut TargetTurn<'_>, req: Request) -> Reply {
        let event = match req {
            Request::Draft { tail, max } => {
                self.corpus.extend(tail);
                // Only the drafting pass's routing predicts its catch-up.
                self.account(false);
                return self.drafter.draft_in(turn, &self.corpus, max);
            }
            Request::Decoded(rows) => {
                self.batch.clear();
                let n = rows.len();
                for (t, pos, logits) in rows {
                    if !self.batch.push(t, pos, logits) {
                        return Err(LlamaError::BatchSize {
                            tokens: n,
                            n_batch: self.batch.capacity() as u32,
                        }
                        .into());
                    }
                }
                Follow::Decoded(&self.batch)
            }
            Request::Begin(ref prompt) => Follow::Begin(prompt),
            Request::Accepted(step) => Follow::Accepted(step),
            Request::Forget => Follow::Forget,
        };
        self.drafter.follow_in(turn, event).map(|_| Vec::new())
    }

    /// Add what the head's decodes streamed to the run's totals; after a
    /// drafting pass, keep the experts it routed at the head's layer.
    fn account(&mut self, drafting: bool) {
        let mut m = self.drafter.take_metrics();
        if drafting {
            self.drafted_experts = m.experts_at(self.layer);
        }
        m.routed.clear();
        self.totals.add(m);
    }

    /// Ask the flash actor to read, in the background, the union of the
    /// experts the drafting pass routed at the head's layer: read while no demand
    /// waits (the verify decode's demands go first), pinned as the draft
    /// requester's until the head's next demand. Never blocks.
    fn predemand(&mut self) {
        let Some(client) = self.predemand.as_mut() else {
            return;
        };
        let union = std::mem::take(&mut self.drafted_experts);
        if union.is_empty() {
            return;
        }
        let _g = tracing::debug_span!("draft.predemand", layer = self.layer, experts = union.len())
            .entered();
        client.background(self.layer, &union);
        self.predemands += 1;
    }
}

impl Request {
    fn name(&self) -> &'static str {
        match self {
            Request::Decoded(_) => "decoded",
            Request::Begin(_) => "begin",
            Request::Accepted(_) => "accepted",
            Request::Forget => "forget",
            Request::Draft { .. } => "draft",
        }
    }
}
