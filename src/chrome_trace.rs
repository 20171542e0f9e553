//! A `tracing` layer that writes the Chrome trace-event format (JSON array of
//! complete events), which Perfetto (ui.perfetto.dev) and chrome://tracing open.
//!
//! Each time a span is entered and left, one `"ph":"X"` event is written with
//! the span's fields as `args`, on the track of the thread that entered it
//! (`tid`, named by a `thread_name` metadata event). Spans entered inside other
//! spans on the same thread nest on that track. The layer is installed by the
//! binary (`--trace-chrome FILE`); [`ChromeTrace::finish`] closes the array.

use std::cell::Cell;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bmoe_output::PendingFile;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Errors of the trace writer.
#[derive(Debug, thiserror::Error)]
pub enum ChromeTraceError {
    #[error("cannot write the trace to {path}: {source} (choose a writable --trace-chrome path)")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the trace {path} failed: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

struct Sink {
    out: BufWriter<File>,
    first: bool,
    events: u64,
    error: Option<std::io::Error>,
    closed: bool,
}

impl Sink {
    fn push(&mut self, event: &str) {
        if self.closed || self.error.is_some() {
            return;
        }
        let sep = if self.first { "\n" } else { ",\n" };
        self.first = false;
        if let Err(e) = self
            .out
            .write_all(sep.as_bytes())
            .and_then(|_| self.out.write_all(event.as_bytes()))
        {
            self.error = Some(e);
        }
        self.events += 1;
    }
}

/// Handle kept by the binary to close the file at the end of the run.
#[derive(Clone)]
pub struct ChromeTrace {
    path: PathBuf,
    sink: Arc<Mutex<Sink>>,
    /// The trace's temporary file, moved over `path` by `finish` (removed, the
    /// file at `path` untouched, when the trace is dropped unfinished).
    pending: Arc<Mutex<Option<PendingFile>>>,
}

/// The layer itself (see the module docs).
///
/// Besides spans, it draws events that carry `elapsed_us` (a duration that ended
/// at the event) and `track` (a lane number): `span` names the bar, the other
/// fields become its args. The flash reader reports each read this way, so a
/// trace shows reads from submission to completion, one lane per queue slot,
/// next to the compute thread's spans.
pub struct ChromeLayer {
    start: Instant,
    sink: Arc<Mutex<Sink>>,
    tracks: Mutex<std::collections::HashSet<u64>>,
}

/// Lanes of duration events start at this tid (threads count from 1).
const TRACK_TID_BASE: u64 = 1000;

/// Fields of a span, rendered once as a JSON object body.
struct Args(String);

/// When the span was last entered (µs since the trace start).
struct Entered(Vec<f64>);

static NEXT_TID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static TID: Cell<u64> = const { Cell::new(0) };
}

impl ChromeTrace {
    /// Create the file and the layer that feeds it.
    pub fn create(path: &Path) -> Result<(Self, ChromeLayer), ChromeTraceError> {
        let (file, pending) =
            PendingFile::create(path).map_err(|source| ChromeTraceError::Create {
                path: path.to_path_buf(),
                source,
            })?;
        let mut out = BufWriter::with_capacity(1 << 16, file);
        out.write_all(b"[")
            .map_err(|source| ChromeTraceError::Write {
                path: path.to_path_buf(),
                source,
            })?;
        let sink = Arc::new(Mutex::new(Sink {
            out,
            first: true,
            events: 0,
            error: None,
            closed: false,
        }));
        let layer = ChromeLayer {
            start: Instant::now(),
            sink: sink.clone(),
            tracks: Mutex::new(Default::default()),
        };
        Ok((
            Self {
                path: path.to_path_buf(),
                sink,
                pending: Arc::new(Mutex::new(Some(pending))),
            },
            layer,
        ))
    }

    /// Close the JSON array and flush. Returns the number of events written.
    /// Spans still open at this point are not written.
    pub fn finish(&self) -> Result<u64, ChromeTraceError> {
        let mut s = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        if s.closed {
            return Ok(s.events);
        }
        s.closed = true;
        let res = s.out.write_all(b"\n]\n").and_then(|_| s.out.flush());
        let err = s.error.take().map(Err).unwrap_or(res);
        // What was written goes into place, complete or not.
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let moved = pending.map_or(Ok(()), |p| p.commit());
        err.and(moved).map_err(|source| ChromeTraceError::Write {
            path: self.path.clone(),
            source,
        })?;
        Ok(s.events)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn json_str(out: &mut String, s: &str) {
    out.push_str(&bmoe_decode::telemetry::json_string(s));
}

struct ArgsVisitor<'a>(&'a mut String);

impl ArgsVisitor<'_> {
    fn key(&mut self, field: &Field) {
        if !self.0.is_empty() {
            self.0.push(',');
        }
        json_str(self.0, field.name());
        self.0.push(':');
    }
}

impl Visit for ArgsVisitor<'_> {
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.key(field);
        let _ = write!(self.0, "{value}");
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.key(field);
        let _ = write!(self.0, "{value}");
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.key(field);
        let _ = write!(self.0, "{value}");
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.key(field);
        if value.is_finite() {
            let _ = write!(self.0, "{value}");
        } else {
            self.0.push_str("null");
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.key(field);
        json_str(self.0, value);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.key(field);
        json_str(self.0, &format!("{value:?}"));
    }
}

impl ChromeLayer {
    fn now_us(&self) -> f64 {
        self.start.elapsed().as_nanos() as f64 / 1000.0
    }

    /// This thread's track id; the first call on a thread also names its track.
    fn tid(&self) -> u64 {
        let tid = TID.with(|t| t.get());
        if tid != 0 {
            return tid;
        }
        let tid = NEXT_TID.fetch_add(1, Ordering::Relaxed);
        TID.with(|t| t.set(tid));
        let name = std::thread::current()
            .name()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("thread-{tid}"));
        self.name_track(tid, &name);
        tid
    }
}

/// Fields of a duration event.
#[derive(Default)]
struct EventFields {
    name: Option<String>,
    track: Option<u64>,
    elapsed_us: Option<f64>,
    args: String,
}

impl Visit for EventFields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "track" {
            self.track = Some(value);
        } else {
            ArgsVisitor(&mut self.args).record_u64(field, value);
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        ArgsVisitor(&mut self.args).record_i64(field, value);
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        if field.name() == "elapsed_us" {
            self.elapsed_us = Some(value);
        } else {
            ArgsVisitor(&mut self.args).record_f64(field, value);
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "span" {
            self.name = Some(value.to_owned());
        } else {
            ArgsVisitor(&mut self.args).record_str(field, value);
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        ArgsVisitor(&mut self.args).record_bool(field, value);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() != "message" {
            ArgsVisitor(&mut self.args).record_debug(field, value);
        }
    }
}

impl ChromeLayer {
    fn name_track(&self, tid: u64, name: &str) {
        let mut ev = String::new();
        let _ = write!(
            ev,
            "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":{tid},\"args\":{{\"name\":"
        );
        json_str(&mut ev, name);
        ev.push_str("}}");
        self.sink
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(&ev);
    }
}

impl<S> Layer<S> for ChromeLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut f = EventFields::default();
        event.record(&mut f);
        let (Some(name), Some(track), Some(dur)) = (f.name, f.track, f.elapsed_us) else {
            return;
        };
        let end = self.now_us();
        let tid = TRACK_TID_BASE + track;
        let fresh = self
            .tracks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tid);
        if fresh {
            let lane = format!("{} lane {track}", event.metadata().target());
            self.name_track(tid, &lane);
        }
        let mut ev = String::with_capacity(160);
        ev.push_str("{\"ph\":\"X\",\"name\":");
        json_str(&mut ev, &name);
        ev.push_str(",\"cat\":");
        json_str(&mut ev, event.metadata().target());
        let _ = write!(
            ev,
            ",\"pid\":1,\"tid\":{tid},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{{}}}}}",
            (end - dur).max(0.0),
            dur.max(0.0),
            f.args
        );
        self.sink
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(&ev);
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut args = String::new();
        attrs.record(&mut ArgsVisitor(&mut args));
        let mut ext = span.extensions_mut();
        ext.insert(Args(args));
        ext.insert(Entered(Vec::new()));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(args) = ext.get_mut::<Args>() {
            values.record(&mut ArgsVisitor(&mut args.0));
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let now = self.now_us();
        let mut ext = span.extensions_mut();
        if let Some(e) = ext.get_mut::<Entered>() {
            e.0.push(now);
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let end = self.now_us();
        let start = {
            let mut ext = span.extensions_mut();
            match ext.get_mut::<Entered>().and_then(|e| e.0.pop()) {
                Some(s) => s,
                None => return,
            }
        };
        let tid = self.tid();
        let mut ev = String::with_capacity(160);
        ev.push_str("{\"ph\":\"X\",\"name\":");
        json_str(&mut ev, span.name());
        ev.push_str(",\"cat\":");
        json_str(&mut ev, span.metadata().target());
        let _ = write!(
            ev,
            ",\"pid\":1,\"tid\":{tid},\"ts\":{start:.3},\"dur\":{:.3},\"args\":{{",
            (end - start).max(0.0)
        );
        if let Some(a) = span.extensions().get::<Args>() {
            ev.push_str(&a.0);
        }
        ev.push_str("}}");
        self.sink
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(&ev);
    }
}
