//! The engine thread: owns the [`Session`] (model, context, expert cache),
//! moves jobs from the bounded queue into its free KV sequences (up to
//! `--parallel` decoded together, one batch per step), and streams each job's
//! events back to its request ([`JobSink`]); a request that went away cancels
//! its job at the next token.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, TryRecvError};

use bmoe_decode::metrics::DecodeMetrics;

use super::error::{ApiError, ServeError};
use super::job::{Done, Event, Job};
use super::job_request::request_of;
use super::metrics as m;
use super::prompt_cache::Hook;
use super::sink::JobSink;
use crate::chat::ChatTemplate;
use crate::engine::{RunConfig, Session, TurnFigures};
use crate::generate::{
    Drafter, Finished, GenerateError, Generation, Multi, NgramDrafter, Request, StopReason,
};
use crate::llama::{Model, Target};

/// Capacities of the worker's one-shot channels: the stop message (only
/// [`Worker::stop`] sends it), the model's ready report, the join's "done".
const STOP_CAPACITY: usize = 1;
const READY_CAPACITY: usize = 1;
const DONE_CAPACITY: usize = 1;

/// The engine thread and its queue's sending side.
pub(crate) struct Worker {
    pub(crate) jobs: crossbeam_channel::Sender<Job>,
    /// The shutdown message: once sent, the thread takes no more jobs, ends
    /// those it runs and says it is done on its one-shot channel.
    stop: crossbeam_channel::Sender<Stop>,
    handle: JoinHandle<()>,
}

/// The message that stops the engine thread, with its one-shot way to say it
/// is done (its last step, before its thread ends).
struct Stop {
    done: crossbeam_channel::Sender<()>,
}

/// What the engine thread says once the model is loaded.
pub struct ModelReady {
    pub notes: Vec<crate::engine::Note>,
    pub n_ctx: u32,
    pub streamed: bool,
    /// How the chat template has the model write tool calls.
    pub call_format: crate::chat::tool_calls::CallFormat,
    /// Whether the chat template writes `<think>` reasoning blocks.
    pub thinks: bool,
}

impl Worker {
    /// Start the thread, which loads the model (the context lives on it, with
    /// `parallel` sequences) and then takes jobs from a queue of `queue`;
    /// returns once it has loaded.
    pub(crate) fn start(
        cfg: RunConfig,
        queue: usize,
        parallel: usize,
        runtime: tokio::runtime::Handle,
        prompt_cache: Option<crate::prompt_cache::Config>,
    ) -> Result<(Self, ModelReady), ServeError> {
        let (jobs, rx) = crossbeam_channel::bounded::<Job>(queue);
        let (stop, stop_rx) = crossbeam_channel::bounded::<Stop>(STOP_CAPACITY);
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(READY_CAPACITY);
        let handle = std::thread::Builder::new()
            .name("bmoe-engine".into())
            .spawn(move || {
                let session = match Session::open_seqs(&cfg, parallel as u32) {
                    Ok(s) => s,
                    Err(e) => return drop(ready_tx.send(Err(e))),
                };
                let loaded = ModelReady {
                    notes: session.notes.clone(),
                    n_ctx: session.n_ctx(),
                    streamed: session.streamed(),
                    call_format: session.chat_template().call_format(),
                    thinks: session.chat_template().thinks(),
                };
                if ready_tx.send(Ok(loaded)).is_err() {
                    return;
                }
                let queue = Queue {
                    jobs: rx,
                    stop: stop_rx,
                };
                let hook = prompt_cache
                    .as_ref()
                    .and_then(|c| Hook::open(c, &cfg, &session, parallel));
                if let Some(h) = &hook {
                    h.warm_experts(&session);
                }
                let (session, hook, done) = serve_jobs(session, &queue, parallel, &runtime, hook);
                if let Some(h) = hook {
                    h.keep_experts(&session);
                    h.close();
                }
                for line in session.close() {
                    crate::say!("{line}");
                }
                if let Some(done) = done {
                    let _ = done.send(());
                }
            })
            .map_err(ServeError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(loaded)) => Ok((Self { jobs, stop, handle }, loaded)),
            Ok(Err(e)) => Err(ServeError::Engine(e)),
            Err(_) => Err(ServeError::EngineThread),
        }
    }

    /// Send the shutdown message, then join the thread once it says it is
    /// done, all within `deadline` (false: it did not end in time and is left
    /// detached, the process exit reclaims it; or it had panicked).
    pub(crate) fn stop(self, deadline: Duration) -> bool {
        let t0 = Instant::now();
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(DONE_CAPACITY);
        // The stop channel holds one message and only this call sends: the
        // send fails only when the thread is already gone, which the join
        // below reports (`done_rx` then sees its sender dropped).
        let _ = self.stop.send(Stop { done: done_tx });
        drop(self.jobs);
        match done_rx.recv_timeout(deadline.saturating_sub(t0.elapsed())) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => self.handle.join().is_ok(),
            Err(RecvTimeoutError::Timeout) => false,
        }
    }
}

/// The engine thread's inbox: jobs from the handlers and the shutdown message.
struct Queue {
    jobs: crossbeam_channel::Receiver<Job>,
    stop: crossbeam_channel::Receiver<Stop>,
}

impl Queue {
    /// The next job, waiting for one when `wait`; `Err` with the shutdown
    /// message's reply channel (None when every sender is gone) once asked to
    /// stop; `Ok(None)` when not waiting and none is queued.
    fn next(&self, wait: bool) -> Result<Option<Job>, Option<Stop>> {
        match self.stop.try_recv() {
            Ok(s) => return Err(Some(s)),
            Err(TryRecvError::Disconnected) => return Err(None),
            Err(TryRecvError::Empty) => {}
        }
        if !wait {
            return match self.jobs.try_recv() {
                Ok(j) => Ok(Some(j)),
                Err(TryRecvError::Empty) => Ok(None),
                Err(TryRecvError::Disconnected) => Err(None),
            };
        }
        crossbeam_channel::select! {
            recv(self.stop) -> s => Err(s.ok()),
            recv(self.jobs) -> j => j.map(Some).map_err(|_| None),
        }
    }
}

/// Run jobs until the shutdown message (or the queue closing) and the last
/// one ends, up to `parallel` of them decoded together; the session back for
/// closing, with the shutdown message's reply channel.
fn serve_jobs(
    mut session: Session,
    queue: &Queue,
    parallel: usize,
    runtime: &tokio::runtime::Handle,
    mut hook: Option<Hook>,
) -> (Session, Option<Hook>, Option<crossbeam_channel::Sender<()>>) {
    let template = session.chat_template();
    let (_, ubatch) = session.context();
    let mut multi = Multi::new(parallel, ubatch.max(parallel));
    // `--ngram`: each sequence's drafter, set when its generation starts.
    let mut drafters: Vec<Option<NgramDrafter>> = (0..parallel).map(|_| None).collect();
    let mut stopped: Option<Option<Stop>> = None;
    loop {
        if stopped.is_none() {
            let admitted = admit_jobs(
                &mut session,
                &template,
                &mut multi,
                queue,
                runtime,
                &mut hook,
                &mut drafters,
            );
            if let Err(stop) = admitted {
                stopped = Some(stop);
            }
        }
        m::slots_busy(multi.busy());
        if multi.busy() == 0 {
            match stopped {
                None => continue,
                Some(stop) => return (session, hook, stop.map(|s| s.done)),
            }
        }
        let (ctx, _) = session.context();
        let mut by_seq: Vec<Option<&mut dyn Drafter<'_>>> = drafters
            .iter_mut()
            .map(|d| d.as_mut().map(|d| d as &mut dyn Drafter<'_>))
            .collect();
        let stepped = multi.step(&mut Target::new(ctx), &mut by_seq);
        match stepped {
            Ok(step) => {
                m::decoded(&step);
                session.record(&TurnFigures {
                    decode: step.elapsed,
                    metrics: step.metrics.clone(),
                    ..TurnFigures::default()
                });
                for f in step.finished {
                    let (seq, keep) = (f.seq, f.generation.stop != StopReason::Interrupted);
                    let restored = hook.as_mut().map_or(0, |h| h.take_restored(seq));
                    complete(&mut session, f, restored);
                    if let Some(h) = hook.as_mut().filter(|_| keep) {
                        h.save(session.context().0, &multi, seq);
                    }
                }
                m::slots_busy(multi.busy());
            }
            Err(e) => {
                let msg = format!("generation failed: {e}");
                let (ctx, _) = session.context();
                for f in multi.end_all(ctx, StopReason::Interrupted) {
                    f.sink.finish(Event::Failed(ApiError::server(&msg)));
                }
                m::slots_busy(0);
            }
        }
    }
}

/// Move queued jobs into free sequences (waiting for one when none is
/// running); `Err` once asked to stop (see [`Queue::next`]).
fn admit_jobs(
    session: &mut Session,
    template: &ChatTemplate,
    multi: &mut Multi<JobSink>,
    queue: &Queue,
    runtime: &tokio::runtime::Handle,
    hook: &mut Option<Hook>,
    drafters: &mut [Option<NgramDrafter>],
) -> Result<(), Option<Stop>> {
    while multi.free() > 0 {
        let Some(job) = queue.next(multi.busy() == 0)? else {
            return Ok(());
        };
        m::queue_depth(queue.jobs.len());
        if job.events.is_closed() {
            m::cancelled();
            continue;
        }
        let mut request = match request_of(session, template, job, runtime) {
            Ok(Some(r)) => r,
            // Only counted: its `Started` said all there is.
            Ok(None) => continue,
            Err((e, events)) => {
                let _ = events.blocking_send(Event::Failed(e));
                continue;
            }
        };
        let drafter = session.drafter_for(&mut request.opts);
        let (ctx, _) = session.context();
        if let Some(h) = hook.as_mut() {
            h.restore(ctx, multi, &request.prompt, request.scope);
        }
        match multi.admit(ctx, request) {
            Ok(seq) => drafters[seq as usize] = drafter,
            Err(refused) => refuse(*refused),
        }
    }
    Ok(())
}

/// Answer a request the loop could not start with why.
fn refuse((e, req): (GenerateError, Request<JobSink>)) {
    let e = match e {
        GenerateError::PromptTooLong {
            prompt_tokens,
            n_ctx,
        } => ApiError::over_context(prompt_tokens, n_ctx as usize),
        e => ApiError::invalid(Some("messages"), e.to_string()),
    };
    req.sink.finish(Event::Failed(e));
}

/// A generation ended: its figures to the session and the metrics, its
/// `Done` to the request.
/// `restored`: the prompt tokens of `f` put back from the prompt cache.
fn complete(session: &mut Session, f: Finished<JobSink>, restored: usize) {
    let g = &f.generation;
    let mut sink = f.sink;
    let figures = TurnFigures {
        turns: 1,
        reused_tokens: f.reused as u64,
        prefilled_tokens: (g.prompt_tokens - f.reused) as u64,
        generated_tokens: g.tokens.len() as u64,
        prefill: g.prefill,
        decode: g.decode,
        metrics: f.share,
        drafted_tokens: g.spec.drafted,
        accepted_tokens: g.spec.accepted,
    };
    session.record(&TurnFigures {
        decode: Duration::ZERO,
        metrics: DecodeMetrics::default(),
        ..figures.clone()
    });
    let gone = sink.gone();
    if gone {
        m::cancelled();
    }
    let finish_reason = match g.stop {
        StopReason::Limit | StopReason::ContextFull => "length",
        StopReason::EndOfText | StopReason::StopString => "stop",
        // Cut short: "length" tells a standard client the reply is not whole.
        StopReason::Interrupted => {
            sink.notes.push(
                "generation cut short: the client went away or the server is shutting down".into(),
            );
            "length"
        }
    };
    if finish_reason == "length" && sink.json_schema {
        sink.notes.push(
            "the reply was cut before its JSON closed: it may not parse or validate against the schema (raise max_tokens)".into(),
        );
    }
    let done = Done {
        finish_reason,
        stop_sequence: stop_sequence(session.model(), g, &sink.stop),
        prompt_tokens: g.prompt_tokens,
        completion_tokens: g.tokens.len(),
        figures,
        notes: std::mem::take(&mut sink.notes),
    };
    m::finished(&done, &sink.requester, sink.t0.elapsed(), &session.totals);
    m::prompt_split(restored, done.figures.prefilled_tokens);
    let _in_request = sink.span.enter();
    tracing::info!(
        prompt_tokens = done.prompt_tokens,
        cached_tokens = f.reused,
        restored_tokens = restored,
        generated_tokens = done.completion_tokens,
        first_token_ms = sink.first_text_ms(),
        total_ms = sink.t0.elapsed().as_millis() as u64,
        finish = logged_finish(gone, g.stop, done.finish_reason),
        "request answered"
    );
    drop(_in_request);
    sink.finish(Event::Done(Box::new(done)));
}

/// What the log says ended a job: the reply's `finish_reason`, unless the
/// client left ("client_gone") or the server stopped it ("interrupted"),
/// which the reply itself can only call "length".
fn logged_finish(gone: bool, stop: StopReason, finish_reason: &'static str) -> &'static str {
    match (gone, stop) {
        (true, _) => "client_gone",
        (false, StopReason::Interrupted) => "interrupted",
        _ => finish_reason,
    }
}

/// The stop string that ended `g`, if one did: the earliest in what its
/// tokens spell after the text handed out.
fn stop_sequence(model: &Model, g: &Generation, stops: &[String]) -> Option<String> {
    if g.stop != StopReason::StopString {
        return None;
    }
    let bytes: Vec<u8> = g
        .tokens
        .iter()
        .flat_map(|&t| model.token_bytes(t, false))
        .collect();
    let tail = String::from_utf8_lossy(bytes.get(g.text.len()..)?);
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| tail.find(s.as_str()).map(|at| (at, s)))
        .min_by_key(|&(at, _)| at)
        .map(|(_, s)| s.clone())
}
