//! `bmoe serve --rpc`: the supervisor in front of an engine process that
//! loses its RPC host, answers for it and starts it again
//! (src/serve/supervisor/, docs/scale-out.md).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{e8k2, stderr, stdout, PROSE};
use crate::rpc::{run_text, Server};
use crate::serve::{completion, Server as Http};

/// `serve --rpc`: the host killed between two requests. The second request
/// gets a clear 502 and /health says the server is reconnecting; once the
/// host is back on its port the engine process is started again and a
/// third request writes the resident text.
#[test]
fn serve_over_rpc_survives_a_lost_host_and_serves_again_once_it_is_back() {
    let model = e8k2().to_str().unwrap();
    let resident = run_text(model, 12, &["--resident", "--ignore-eos"]);
    assert!(resident.status.success(), "{}", stderr(&resident));
    let want = stdout(&resident).trim_end_matches('\n').to_string();
    let host = Server::start();
    let port: u16 = host.addr.rsplit(':').next().unwrap().parse().unwrap();
    let addr = host.addr.clone();
    let http = Http::start(&["--rpc", &addr, "--rpc-layers", "8", "--cache-mb", "0"]);
    let body = completion(PROSE, json!({"max_tokens": 12}));
    let text = |v: &serde_json::Value| v["choices"][0]["text"].as_str().unwrap_or("").to_string();
    let (s, first) = http.post("/v1/completions", &body);
    assert_eq!((s, text(&first)), (200, want.clone()), "{first}");

    drop(host);
    let (s, lost) = http.post("/v1/completions", &body);
    assert_eq!(s, 502, "{lost}");
    let msg = lost["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("RPC host was lost"), "{msg}");
    let (s, health) = http.request("GET", "/health", "", &[]);
    assert!(s == 503 && health.contains("reconnecting"), "{s} {health}");
    let (s, refused) = http.request("GET", "/v1/models", "", &[]);
    assert!(s == 503 && refused.contains("restarting"), "{s} {refused}");

    let _host = Server::start_at(port, &[]);
    let t0 = Instant::now();
    loop {
        let (s, health) = http.request("GET", "/health", "", &[]);
        if s == 200 {
            assert!(health.contains("\"engine_restarts\":1"), "{health}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the server did not come back: {health}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let (s, again) = http.post("/v1/completions", &body);
    assert_eq!((s, text(&again)), (200, want), "{again}");
    let status = http.terminate(30);
    assert!(status.success(), "the supervisor's exit: {status:?}");
}
