//! The supervisor's HTTP side: every request forwarded to the engine
//! process while it serves, answered here while it does not (503 with the
//! reason, `Retry-After`), and a request the engine died under answered with
//! 502 in its route's error shape; `/health` says which.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt as _;
use http_body_util::BodyExt as _;
use serde_json::json;

use super::state::{Phase, Supervised};
use crate::serve::anthropic;
use crate::serve::error::ApiError;

/// How long a request the engine failed under waits for the supervisor to
/// see the engine process end (its reason then goes into the answer).
const LOSS_SEEN_WITHIN: Duration = Duration::from_secs(5);

/// Headers of one hop only (RFC 9110 7.6.1), not forwarded either way.
const HOP_BY_HOP: [header::HeaderName; 5] = [
    header::CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
];

/// Every route: `/health` answered here, the rest forwarded or refused.
pub(super) async fn handle(State(sup): State<Arc<Supervised>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    if path == "/health" {
        let (code, body) = sup.health();
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        return (status, Json(body)).into_response();
    }
    let Phase::Ready(addr) = sup.phase() else {
        return in_shape(&path, unavailable(&sup.phase()));
    };
    match forward(addr, req).await {
        Ok(resp) => relay(&path, resp),
        Err(e) => in_shape(&path, lost_during(&sup, addr, e).await),
    }
}

/// Send `req` to the engine process at `addr`; its response's head.
async fn forward(
    addr: std::net::SocketAddr,
    mut req: Request,
) -> Result<hyper::Response<hyper::body::Incoming>, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut tx, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    *req.version_mut() = Version::HTTP_11;
    strip_hop_by_hop(req.headers_mut());
    tx.send_request(req).await.map_err(|e| e.to_string())
}

fn strip_hop_by_hop(h: &mut HeaderMap) {
    for name in &HOP_BY_HOP {
        h.remove(name);
    }
    h.remove("keep-alive");
}

/// The engine's response passed on; an event stream the engine died in
/// ends with an error event of the route's dialect instead of just stopping.
fn relay(path: &str, resp: hyper::Response<hyper::body::Incoming>) -> Response {
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !sse {
        return Response::from_parts(parts, Body::new(body));
    }
    let tail = Bytes::from(stream_error_event(
        path,
        "the engine process ended during this reply (an RPC host lost?); bmoe serve is \
         restarting it: GET /health says when it is back",
    ));
    let frames = futures_util::stream::unfold(Some((body.into_data_stream(), tail)), |s| async {
        let (mut data, tail) = s?;
        match data.next().await {
            Some(Ok(b)) => Some((Ok::<_, std::convert::Infallible>(b), Some((data, tail)))),
            Some(Err(_)) => Some((Ok(tail), None)),
            None => None,
        }
    });
    Response::from_parts(parts, Body::from_stream(frames))
}

/// One server-sent event saying `message` in the dialect of `path`'s route.
pub(super) fn stream_error_event(path: &str, message: &str) -> String {
    let e = ApiError::new(StatusCode::BAD_GATEWAY, "server_error", message);
    if path.starts_with(anthropic::MESSAGES) {
        format!("event: error\ndata: {}\n\n", anthropic::error_body(&e))
    } else if path.starts_with(crate::serve::responses::RESPONSES) {
        // An `error`, then `response.failed` as the engine's own streamer
        // ends a failed reply (the proxy does not know the response's id).
        let v = json!({"type": "error", "code": e.kind, "message": e.message, "param": null});
        let failed = json!({"type": "response.failed", "response": {
            "object": "response", "status": "failed", "output": [],
            "error": {"code": e.kind, "message": e.message}}});
        format!("event: error\ndata: {v}\n\nevent: response.failed\ndata: {failed}\n\n")
    } else {
        format!("data: {}\n\n", e.json())
    }
}

/// 503 while no engine process serves: starting, or why it is restarting.
pub(super) fn unavailable(phase: &Phase) -> ApiError {
    let why = match phase {
        Phase::Reconnecting { reason, attempts } => format!(
            "bmoe serve is restarting its engine process, which stopped: {reason} \
             ({attempts} failed start(s) since); retry in a moment, GET /health says when it is back"
        ),
        _ => "the engine process is starting; retry in a moment".to_string(),
    };
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", why)
}

/// 502 for a request the engine process at `addr` did not answer: the
/// reason it ended once the supervisor saw it end (within
/// [`LOSS_SEEN_WITHIN`]), else the connection's error.
async fn lost_during(sup: &Supervised, addr: std::net::SocketAddr, err: String) -> ApiError {
    let t0 = Instant::now();
    let mut phase = sup.phase();
    while phase == Phase::Ready(addr) && t0.elapsed() < LOSS_SEEN_WITHIN {
        tokio::time::sleep(Duration::from_millis(50)).await;
        phase = sup.phase();
    }
    let why = match phase {
        Phase::Reconnecting { reason, .. } => reason,
        _ => format!("it did not answer ({err})"),
    };
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "server_error",
        format!(
            "the engine process stopped during this request: {why}; bmoe serve is restarting \
             it: retry the request once GET /health says ok"
        ),
    )
}

/// `e` as the route of `path` answers errors.
fn in_shape(path: &str, e: ApiError) -> Response {
    if path.starts_with(anthropic::MESSAGES) {
        return anthropic::error_response(e);
    }
    e.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_ends_with_an_error_event_of_its_dialect() {
        let data = |ev: &str| -> serde_json::Value {
            let line = ev.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            serde_json::from_str(line).unwrap()
        };
        let a = stream_error_event("/v1/messages", "gone");
        assert!(a.starts_with("event: error\n"));
        assert_eq!(data(&a)["error"]["message"], "gone");
        assert_eq!(data(&a)["type"], "error");
        let r = stream_error_event("/v1/responses", "gone");
        assert!(r.starts_with("event: error\n"));
        assert_eq!(data(&r)["message"], "gone");
        // Issue 64, finding 9: a Responses stream also ends response.failed.
        let (_, last) = r.trim_end().rsplit_once("\n\n").unwrap();
        assert!(last.starts_with("event: response.failed\n"), "{r}");
        assert_eq!(data(last)["response"]["error"]["message"], "gone");
        let c = stream_error_event("/v1/chat/completions", "gone");
        assert!(c.starts_with("data: ") && c.ends_with("\n\n"));
        assert_eq!(data(&c)["error"]["message"], "gone");
    }

    #[test]
    fn a_restart_is_a_503_naming_its_reason() {
        let e = unavailable(&Phase::Reconnecting {
            reason: "an RPC host was lost: send failed".into(),
            attempts: 3,
        });
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.message.contains("send failed") && e.message.contains("3 failed"));
        assert!(unavailable(&Phase::Starting).message.contains("starting"));
    }
}
