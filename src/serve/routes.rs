//! The HTTP routes (axum): the two completion endpoints, streamed as
//! server-sent events or answered whole, `/v1/models`, `/health`, `/metrics`,
//! and the API-key check (`auth.rs`) in front of them.

use std::convert::Infallible;
use std::sync::atomic::Ordering;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt as _};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::anthropic;
use super::api::{self, ApiError, ChatRequest, CompletionRequest, JobSpec};
use super::auth::check_key;
use super::metrics as m;
use super::responses;
use super::tenant;
use super::tools::{chat_deltas, ReplySplit, Shown};
use super::worker::{App, Done, Event, Job, EVENT_CAPACITY};

/// The router over the shared state (`prometheus` renders `/metrics`).
pub(crate) fn router(
    app: App,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route(anthropic::MESSAGES, post(anthropic::messages))
        .route(anthropic::COUNT_TOKENS, post(anthropic::count_tokens))
        .route(responses::RESPONSES, post(responses::responses))
        .route("/v1/models", get(models))
        .route("/metrics", get(move || async move { prometheus.render() }))
        .route_layer(middleware::from_fn_with_state(app.clone(), check_key));
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .merge(api)
        .fallback(|uri: Uri| async move {
            let e = ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "no such route",
            );
            if uri.path().starts_with(anthropic::MESSAGES) {
                return anthropic::error_response(e);
            }
            e.into_response()
        })
        .layer(middleware::from_fn_with_state(
            app.clone(),
            refuse_oversized,
        ))
        .with_state(app)
        .layer(cors())
        .layer(trace())
}

/// Each request in the log at info (`-v`): its method and path as the
/// span, its status and time to the response's head when answered (the
/// engine thread adds its tokens and times inside the same span), and a
/// failed one at warn (tower-http's trace layer).
fn trace() -> tower_http::trace::TraceLayer<
    tower_http::classify::SharedClassifier<tower_http::classify::ServerErrorsAsFailures>,
    tower_http::trace::DefaultMakeSpan,
    (),
    tower_http::trace::DefaultOnResponse,
> {
    use tower_http::trace::{DefaultMakeSpan, DefaultOnResponse, TraceLayer};
    use tower_http::LatencyUnit;
    TraceLayer::new_for_http()
        .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO))
        .on_request(())
        .on_response(
            DefaultOnResponse::new()
                .level(tracing::Level::INFO)
                .latency_unit(LatencyUnit::Millis),
        )
}

/// A request whose declared `Content-Length` is over the body limit gets 413
/// at once, before any of its body is read: a client that declares far more
/// than it sends is not waited for. (A body without a declared length is
/// bounded as it is read, [`read_body`].)
async fn refuse_oversized(State(app): State<App>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_none_or(|n| n <= app.body_limit_bytes as u64) {
        return next.run(req).await;
    }
    let path = req.uri().path();
    let route = match path {
        "/v1/chat/completions" => "chat",
        "/v1/completions" => "completions",
        anthropic::MESSAGES => "messages",
        responses::RESPONSES => "responses",
        _ => "other",
    };
    m::request(route, 413);
    let e = too_large(app.body_limit_bytes);
    if path.starts_with(anthropic::MESSAGES) {
        return anthropic::error_response(e);
    }
    e.into_response()
}

/// 413: the body is over `--body-limit-kb`.
fn too_large(limit_bytes: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        format!(
            "the request body is over the server's limit of {limit_bytes} bytes (bmoe serve --body-limit-kb)"
        ),
    )
}

/// Browser front ends on another origin: every reply may be read by any
/// origin, and a preflight (`OPTIONS`, which carries no key) is answered
/// before the key check (tower-http's CORS layer).
fn cors() -> tower_http::cors::CorsLayer {
    use tower_http::cors::{Any, CorsLayer};
    CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([axum::http::Method::GET, axum::http::Method::POST])
        .allow_headers(Any)
        .max_age(std::time::Duration::from_secs(600))
}

/// One entry per served name (`--served-name`), so that the model a client
/// picks from the list is one the server answers to, with the window a
/// request has (a sequence's positions, prompt and reply together) under the
/// names clients read: `context_length` and vLLM's `max_model_len`.
async fn models(State(app): State<App>) -> Json<Value> {
    let data: Vec<Value> = app
        .served_names
        .iter()
        .map(|id| {
            json!({"id": id, "object": "model", "created": app.created_s, "owned_by": "bmoe",
                "context_length": app.context_length, "max_model_len": app.context_length})
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn chat(State(app): State<App>, body: Body) -> Response {
    let spec = read_body(&app, body)
        .await
        .and_then(|b| api::parse::<ChatRequest>(&b))
        .and_then(|r| r.into_spec(&app.defaults));
    answer(app, "chat", spec).await
}

async fn completions(State(app): State<App>, body: Body) -> Response {
    let spec = read_body(&app, body)
        .await
        .and_then(|b| api::parse::<CompletionRequest>(&b))
        .and_then(|r| r.into_spec(&app.defaults));
    answer(app, "completions", spec).await
}

/// The most bytes of a request body the debug log shows.
const BODY_LOG_MAX_BYTES: usize = 16 * 1024;

/// The body (said in the log at debug level, its first
/// [`BODY_LOG_MAX_BYTES`]), or 413 past the server's limit.
pub(super) async fn read_body(app: &App, body: Body) -> Result<axum::body::Bytes, ApiError> {
    let b = read_whole(app, body).await?;
    if tracing::enabled!(tracing::Level::DEBUG) {
        let shown = String::from_utf8_lossy(&b[..b.len().min(BODY_LOG_MAX_BYTES)]);
        tracing::debug!(bytes = b.len(), "request body: {shown}");
    }
    Ok(b)
}

async fn read_whole(app: &App, body: Body) -> Result<axum::body::Bytes, ApiError> {
    to_bytes(body, app.body_limit_bytes).await.map_err(|e| {
        let over = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if !over {
            // Cut short, or the connection broke: not the client's size.
            return ApiError::invalid(
                None,
                format!("the request body could not be read whole ({e})"),
            );
        }
        too_large(app.body_limit_bytes)
    })
}

/// Queue the job and answer: an error before any text, else the stream or the whole reply.
async fn answer(app: App, route: &'static str, spec: Result<JobSpec, ApiError>) -> Response {
    let res = match spec {
        Ok(spec) => run(&app, route, spec).await,
        Err(e) => Err(e),
    };
    match res {
        Ok(r) => r,
        Err(e) => {
            m::request(route, e.status.as_u16());
            e.into_response()
        }
    }
}

async fn run(app: &App, route: &'static str, spec: JobSpec) -> Result<Response, ApiError> {
    let (stream, usage) = (spec.stream, spec.include_usage);
    let chat = spec.prompt.is_chat();
    let calls = ReplySplit::of(&spec, app.call_format);
    let thinks = app.thinks && chat;
    let (rx, started) = start_job(app, spec).await?;
    let calls = calls.started(thinks, &started);
    let reply = Reply {
        id: reply_id(app, if chat { "chatcmpl-" } else { "cmpl-" }),
        created: super::now_s(),
        model: app.model_id.clone(),
        chat,
        calls,
    };
    m::request(route, 200);
    if stream {
        return Ok(sse(reply, rx, usage).into_response());
    }
    whole(reply, rx).await
}

/// A response's id: `prefix`, `bmoe`, this run's random part and the
/// request's number, unique across restarts as well as within a run.
pub(super) fn reply_id(app: &App, prefix: &str) -> String {
    let n = app.next_id.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}bmoe{}-{n}", app.run_id)
}

/// What a job said when it started.
#[derive(Debug, Clone, Copy)]
pub(super) struct Started {
    pub(super) prompt_tokens: usize,
    /// The most tokens the reply may have (the request's, capped to what the
    /// context leaves).
    pub(super) max_tokens: u32,
    /// The rendered prompt ends inside a reasoning block.
    pub(super) reasoning_open: bool,
    /// A grammar holds the reply's tool calls to the template's format.
    pub(super) calls_held: bool,
}

/// Queue the job and wait for it to start: its events and what it said, or
/// the error it failed with before any text. A request without
/// `max_tokens` gets the server's `-n`.
pub(super) async fn start_job(
    app: &App,
    mut spec: JobSpec,
) -> Result<(mpsc::Receiver<Event>, Started), ApiError> {
    spec.max_tokens.get_or_insert(app.default_max_tokens);
    let (tx, mut rx) = mpsc::channel(EVENT_CAPACITY);
    let span = tracing::Span::current();
    let scope = tenant::scope_of(app.cache_scope, &spec.requester);
    let job = Job {
        spec,
        events: tx,
        span,
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
        crossbeam_channel::TrySendError::Disconnected(_) => shutting_down(),
    })?;
    m::queue_depth(app.jobs.len());
    match rx.recv().await {
        Some(Event::Started {
            prompt_tokens,
            max_tokens,
            reasoning_open,
            calls_held,
        }) => Ok((
            rx,
            Started {
                prompt_tokens,
                max_tokens,
                reasoning_open,
                calls_held,
            },
        )),
        Some(Event::Failed(e)) => Err(e),
        _ => Err(shutting_down()),
    }
}

/// A job's text gathered until it ends, then the whole reply `reply` makes of
/// it (each dialect's own shape); its failure, or 503 if the engine went away.
pub(super) async fn whole_reply(
    mut rx: tokio::sync::mpsc::Receiver<super::worker::Event>,
    reply: impl FnOnce(&str, &super::worker::Done) -> serde_json::Value,
) -> Result<Response, ApiError> {
    use super::worker::Event;
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done(d) => return Ok(Json(reply(&text, &d)).into_response()),
            Event::Failed(e) => return Err(e),
            Event::Started { .. } => {}
        }
    }
    Err(shutting_down())
}

/// Named server-sent events (`event: NAME`, its JSON as data), the opening
/// ones first, kept alive: the Anthropic and Responses dialects' streams.
pub(super) fn named_sse(
    opening: Vec<(&'static str, Value)>,
    events: impl Stream<Item = (&'static str, Value)> + Send + 'static,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let all = stream::iter(opening)
        .chain(events)
        .map(|(name, data)| Ok(SseEvent::default().event(name).data(data.to_string())));
    Sse::new(all).keep_alive(KeepAlive::default())
}

pub(super) fn shutting_down() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "the server is shutting down",
    )
}

/// What every response object of one request carries.
struct Reply {
    id: String,
    /// When the request was answered (seconds since the epoch).
    created: u64,
    model: String,
    chat: bool,
    /// How a chat reply's tool calls are split from its text.
    calls: ReplySplit,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.chat, chunk) {
            (true, false) => "chat.completion",
            (true, true) => "chat.completion.chunk",
            (false, _) => "text_completion",
        }
    }

    /// One choice carrying `text` (a delta when streaming).
    fn choice(&self, text: &str, finish: Option<&str>, chunk: bool) -> Value {
        match (self.chat, chunk) {
            (true, true) if finish.is_some() => {
                json!({"index": 0, "delta": {}, "finish_reason": finish})
            }
            (true, true) => json!({"index": 0, "delta": {"content": text}, "finish_reason": null}),
            (true, false) => {
                json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish})
            }
            (false, _) => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
        }
    }

    /// A streamed piece's choices (a chat's reasoning and content apart).
    fn deltas(&self, shown: &Shown) -> Box<dyn Iterator<Item = Value> + Send> {
        if self.chat {
            return Box::new(chat_deltas(shown));
        }
        let text = (!shown.content.is_empty()).then(|| self.choice(&shown.content, None, true));
        Box::new(text.into_iter())
    }

    fn envelope(&self, choices: Value, chunk: bool) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": choices})
    }
}

fn usage(d: &Done) -> Value {
    json!({"prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens,
           "total_tokens": d.prompt_tokens + d.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": d.figures.reused_tokens}})
}

/// What bmoe adds to a response: the notes and the turn's own figures.
fn extra(d: &Done) -> Value {
    let f = &d.figures;
    json!({"notes": d.notes, "prefilled_tokens": f.prefilled_tokens, "reused_tokens": f.reused_tokens,
           "decode_tok_s": f.decode_tok_s(), "flash_read_bytes": f.metrics.read_bytes,
           "cache_hit_pct": f.hit_pct()})
}

/// The whole reply once generation ends.
async fn whole(reply: Reply, mut rx: mpsc::Receiver<Event>) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done(d) => {
                let choice = if reply.chat {
                    reply.calls.choice(&text, d.finish_reason)
                } else {
                    reply.choice(&text, Some(d.finish_reason), false)
                };
                let mut body = reply.envelope(json!([choice]), false);
                body["usage"] = usage(&d);
                body["bmoe"] = extra(&d);
                return Ok(Json(body).into_response());
            }
            Event::Failed(e) => return Err(e),
            Event::Started { .. } => {}
        }
    }
    Err(shutting_down())
}

/// Server-sent events: a role chunk (chat), one chunk per piece of text, the
/// finish chunk, the usage chunk when asked for, then `[DONE]`.
fn sse(
    reply: Reply,
    rx: mpsc::Receiver<Event>,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let data = |v: Value| SseEvent::default().data(v.to_string());
    let first = reply.chat.then(|| {
        data(reply.envelope(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]), true))
    });
    let mut split = reply.calls.stream();
    let events = ReceiverStream::new(rx).flat_map(move |ev| {
        let chunk = |c: Value| data(reply.envelope(json!([c]), true));
        let out: Vec<SseEvent> = match ev {
            Event::Text(t) => reply.deltas(&split.push(&t)).map(chunk).collect(),
            Event::Done(d) => {
                let (rest, finish) = reply.calls.end(std::mem::take(&mut split), d.finish_reason);
                let mut v: Vec<SseEvent> = reply.deltas(&rest).map(chunk).collect();
                // The finish chunk carries bmoe's notes (a reply cut short says so).
                let mut last = reply.envelope(json!([reply.choice("", Some(finish), true)]), true);
                last["bmoe"] = json!({"notes": d.notes});
                v.push(data(last));
                if include_usage {
                    let mut u = reply.envelope(json!([]), true);
                    u["usage"] = usage(&d);
                    u["bmoe"] = extra(&d);
                    v.push(data(u));
                }
                v.push(SseEvent::default().data("[DONE]"));
                v
            }
            Event::Failed(e) => vec![data(e.body())],
            Event::Started { .. } => Vec::new(),
        };
        stream::iter(out)
    });
    let all = stream::iter(first).chain(events).map(Ok);
    Sse::new(all).keep_alive(KeepAlive::default())
}
