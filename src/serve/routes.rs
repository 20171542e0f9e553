//! The wiring of the HTTP server (axum): each dialect's routes on the one
//! answer loop (`answer.rs`), `/v1/models`, `/health`, `/metrics`, the
//! API-key check (`auth.rs`) in front of them, the body limit, CORS and the
//! request log. No dialect's shapes live here.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::answer::{handle, too_large};
use super::anthropic::{self, Messages};
use super::app::App;
use super::auth::check_key;
use super::error::ApiError;
use super::metrics as m;
use super::openai::{self, Chat, Completions};
use super::responses::{self, Responses};

/// The router over the shared state (`prometheus` renders `/metrics`).
pub(crate) fn router(
    app: App,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
) -> Router {
    let api = Router::new()
        .route(openai::CHAT, post(handle::<Chat>))
        .route(openai::COMPLETIONS, post(handle::<Completions>))
        .route(anthropic::MESSAGES, post(handle::<Messages>))
        .route(anthropic::COUNT_TOKENS, post(anthropic::count_tokens))
        .route(responses::RESPONSES, post(handle::<Responses>))
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
/// bounded as it is read, `answer::read_body`.)
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
        openai::CHAT => "chat",
        openai::COMPLETIONS => "completions",
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
