//! The one answer loop of every dialect: a request's body read (within the
//! server's limit) and checked into a [`JobSpec`], the job queued and
//! waited for until it starts, then the worker's [`Event`]s turned into the
//! dialect's server-sent events or, once the job is done, its whole reply.
//! A dialect is a [`Route`] (how its body is read, how its errors look)
//! and a [`Dialect`] (the opening of a stream, each piece of text, the
//! closing, a failure after the start and the whole reply): a fourth one is
//! one folder beside `openai/`, `anthropic/` and `responses/` and a line in
//! `routes.rs`.

use std::convert::Infallible;

use axum::body::{to_bytes, Body};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bmoe_decode::sampling::SamplingParams;
use futures_util::stream::{self, Stream, StreamExt as _};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::app::App;
use super::error::ApiError;
use super::job::{Done, Event, Job, JobSpec, Started, EVENT_CAPACITY};
use super::metrics as m;
use super::split::ReplySplit;
use super::tenant;

/// One server-sent event of a reply: its name (None: an unnamed event, as
/// OpenAI's chunks are) and its data.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Out {
    pub(crate) name: Option<&'static str>,
    pub(crate) data: String,
}

impl Out {
    /// The event `name` carrying `data`.
    pub(crate) fn named(name: &'static str, data: &Value) -> Self {
        Self {
            name: Some(name),
            data: data.to_string(),
        }
    }

    /// An unnamed event carrying `data`.
    pub(crate) fn data(data: &Value) -> Self {
        Self::text(data.to_string())
    }

    /// An unnamed event carrying `text` as it is (OpenAI's `[DONE]`).
    pub(crate) fn text(text: impl Into<String>) -> Self {
        Self {
            name: None,
            data: text.into(),
        }
    }

    /// The event's lines, its name first (`event:` before `data:`, as
    /// every client reads them).
    fn sse(self) -> SseEvent {
        let e = match self.name {
            Some(name) => SseEvent::default().event(name),
            None => SseEvent::default(),
        };
        e.data(self.data)
    }
}

/// Named events as [`Out`]s (the Anthropic and Responses streamers').
pub(crate) fn named(events: Vec<(&'static str, Value)>) -> Vec<Out> {
    events
        .into_iter()
        .map(|(name, data)| Out::named(name, &data))
        .collect()
}

/// A reply in one dialect, from the job's start to its end.
pub(crate) trait Dialect: Send + 'static {
    /// The events that open a stream, before any text.
    fn opening(&mut self) -> Vec<Out>;
    /// The events of a piece of text.
    fn text(&mut self, piece: &str) -> Vec<Out>;
    /// The events that close a stream once the job is done.
    fn closing(&mut self, done: &Done) -> Vec<Out>;
    /// The events of a failure after the stream began.
    fn failed(&mut self, e: &ApiError) -> Vec<Out>;
    /// The whole (non-streamed) reply, once the job is done.
    fn whole(&self, text: &str, done: &Done) -> Value;
    /// Headers of the dialect's own on the response.
    fn headers(&self, _started: &Started, _headers: &mut HeaderMap) {}
}

/// A route of a dialect: how its body is read, how it refuses.
pub(crate) trait Route: Sized + Send + 'static {
    /// The metrics label.
    const LABEL: &'static str;
    /// The reply it answers with.
    type Reply: Dialect;
    /// The body read and checked into the job, and what the reply needs of
    /// the request besides.
    fn read(body: &[u8], defaults: &SamplingParams) -> Result<(JobSpec, Self), ApiError>;
    /// The reply of a job that started (`split`: how its text splits).
    fn reply(self, app: &App, started: &Started, split: ReplySplit) -> Self::Reply;
    /// An error before the first event, as the dialect answers one
    /// (OpenAI's shape unless it says otherwise).
    fn refuse(e: ApiError) -> Response {
        e.into_response()
    }
    /// A failure of the job before it started, as the dialect names it.
    fn start_failed(e: ApiError) -> ApiError {
        e
    }
}

/// The handler of route `R`: read, queue, answer; every outcome counted
/// under its label and status.
pub(crate) async fn handle<R: Route>(State(app): State<App>, body: Body) -> Response {
    let res = match read_body(&app, body).await {
        Ok(b) => match R::read(&b, &app.defaults) {
            Ok((spec, route)) => run(&app, spec, route).await,
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match res {
        Ok(r) => {
            m::request(R::LABEL, 200);
            r
        }
        Err(e) => {
            m::request(R::LABEL, e.status.as_u16());
            R::refuse(e)
        }
    }
}

/// Queue the job and answer: an error before any text, else the stream or
/// the whole reply.
async fn run<R: Route>(app: &App, spec: JobSpec, route: R) -> Result<Response, ApiError> {
    let stream = spec.stream;
    let thinks = app.thinks && spec.prompt.is_chat();
    let split = ReplySplit::of(&spec, app.call_format);
    let (rx, started) = start_job(app, spec).await.map_err(R::start_failed)?;
    let split = split.started(thinks, &started);
    let reply = route.reply(app, &started, split);
    let mut headers = HeaderMap::new();
    reply.headers(&started, &mut headers);
    let mut response = if stream {
        sse(reply, rx).into_response()
    } else {
        whole(reply, rx).await?
    };
    response.headers_mut().extend(headers);
    Ok(response)
}

/// The job's events as the dialect's server-sent events: its opening, each
/// event's, kept alive while the engine works.
fn sse<D: Dialect>(
    mut reply: D,
    rx: mpsc::Receiver<Event>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let opening = reply.opening();
    let events = ReceiverStream::new(rx).flat_map(move |ev| {
        let out = match ev {
            Event::Text(t) => reply.text(&t),
            // The reply ends with the first Done (there is no second).
            Event::Done(d) => reply.closing(&d),
            Event::Failed(e) => reply.failed(&e),
            Event::Started(_) => Vec::new(),
        };
        stream::iter(out)
    });
    let all = stream::iter(opening).chain(events).map(|o| Ok(o.sse()));
    Sse::new(all).keep_alive(KeepAlive::default())
}

/// The job's text gathered until it ends, then the dialect's whole reply;
/// its failure, or 503 if the engine went away.
async fn whole<D: Dialect>(reply: D, mut rx: mpsc::Receiver<Event>) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done(d) => return Ok(Json(reply.whole(&text, &d)).into_response()),
            Event::Failed(e) => return Err(e),
            Event::Started(_) => {}
        }
    }
    Err(ApiError::shutting_down())
}

/// Queue the job and wait for it to start: its events and what it said, or
/// the error it failed with before any text. A request without
/// `max_tokens` gets the server's `-n`.
pub(crate) async fn start_job(
    app: &App,
    mut spec: JobSpec,
) -> Result<(mpsc::Receiver<Event>, Started), ApiError> {
    spec.max_tokens.get_or_insert(app.default_max_tokens);
    let (tx, mut rx) = mpsc::channel(EVENT_CAPACITY);
    let scope = tenant::scope_of(app.cache_scope, &spec.requester);
    let job = Job {
        spec,
        events: tx,
        span: tracing::Span::current(),
        scope,
    };
    app.jobs.try_send(job).map_err(|e| match e {
        crossbeam_channel::TrySendError::Full(_) => {
            m::rejected();
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "the server's queue is full: retry later (the server's --queue bounds waiting requests)",
            )
        }
        crossbeam_channel::TrySendError::Disconnected(_) => ApiError::shutting_down(),
    })?;
    m::queue_depth(app.jobs.len());
    match rx.recv().await {
        Some(Event::Started(started)) => Ok((rx, started)),
        Some(Event::Failed(e)) => Err(e),
        _ => Err(ApiError::shutting_down()),
    }
}

/// The most bytes of a request body the debug log shows.
const BODY_LOG_MAX_BYTES: usize = 16 * 1024;

/// The body (said in the log at debug level, its first
/// [`BODY_LOG_MAX_BYTES`]), or 413 past the server's limit.
pub(crate) async fn read_body(app: &App, body: Body) -> Result<axum::body::Bytes, ApiError> {
    let b = to_bytes(body, app.body_limit_bytes).await.map_err(|e| {
        let over = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if !over {
            // Cut short, or the connection broke: not the client's size.
            return ApiError::body(format!("the request body could not be read whole ({e})"));
        }
        too_large(app.body_limit_bytes)
    })?;
    if tracing::enabled!(tracing::Level::DEBUG) {
        let shown = String::from_utf8_lossy(&b[..b.len().min(BODY_LOG_MAX_BYTES)]);
        tracing::debug!(bytes = b.len(), "request body: {shown}");
    }
    Ok(b)
}

/// 413: the body is over `--body-limit-kb`.
pub(crate) fn too_large(limit_bytes: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        format!(
            "the request body is over the server's limit of {limit_bytes} bytes (bmoe serve --body-limit-kb)"
        ),
    )
}
