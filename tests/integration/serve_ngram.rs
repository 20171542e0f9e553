//! `bmoe serve --ngram` (issue 74): the server's generations draft through
//! the same loop as `bmoe run --ngram`, each sequence with a matcher of its
//! own: a greedy completion is run's text with drafts kept, a sampled one
//! goes without, and sequences decoded together each draft.

use std::sync::Arc;

use serde_json::{json, Value};

use super::common::{e8k2_cli, stdout};
use super::serve::{completion, Server};

/// A prompt whose reply repeats it: the matcher has something to draft from.
const COPY: &str = "Copy this line exactly: def distance(a, b): dx = a.x - b.x; \
                    dy = a.y - b.y; return math.sqrt(dx * dx + dy * dy)\n\
                    def distance(a, b): dx = a.x - b.x;";

fn drafts(reply: &Value) -> (u64, u64) {
    let b = &reply["bmoe"];
    let n = |k: &str| b[k].as_u64().unwrap_or_else(|| panic!("{k} in {reply}"));
    (n("drafted_tokens"), n("accepted_tokens"))
}

#[test]
fn serve_with_ngram_writes_runs_text_and_drafts_in_every_sequence() {
    let run = e8k2_cli(COPY, 32, &["--ngram"]);
    assert!(run.status.success());
    let expected = stdout(&run).trim_end_matches('\n').to_string();
    let server = Server::start(&["--ngram"]);
    let body = completion(COPY, json!({"max_tokens": 32}));
    let (s, greedy) = server.post("/v1/completions", &body);
    assert_eq!(s, 200, "{greedy}");
    assert_eq!(
        greedy["choices"][0]["text"],
        expected.as_str(),
        "run's text"
    );
    let (drafted, accepted) = drafts(&greedy);
    assert!(accepted > 0 && drafted >= accepted, "{greedy}");
    let sampled = completion(
        COPY,
        json!({"max_tokens": 8, "temperature": 0.8, "seed": 3}),
    );
    let (s, sampled) = server.post("/v1/completions", &sampled);
    assert_eq!(s, 200, "{sampled}");
    assert_eq!(drafts(&sampled), (0, 0), "a sampled reply drafts nothing");
    drop(server);

    // Two at once in two sequences: each drafts with its own matcher.
    let server = Arc::new(Server::start(&["--ngram", "--parallel", "2"]));
    let both: Vec<_> = (0..2)
        .map(|_| {
            let (server, body) = (server.clone(), body.clone());
            std::thread::spawn(move || server.post("/v1/completions", &body))
        })
        .collect();
    for h in both {
        let (s, reply) = h.join().expect("a client thread");
        assert_eq!(s, 200, "{reply}");
        assert!(drafts(&reply).1 > 0, "{reply}");
    }
}

#[test]
fn serve_refuses_ngram_with_a_sampling_temperature() {
    let m = super::common::e8k2();
    let o = super::common::bmoe(&[
        "serve",
        "-m",
        m.to_str().unwrap(),
        "--ngram",
        "--temp",
        "0.7",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", super::common::stderr(&o));
    assert!(super::common::stderr(&o).contains("--temp 0.7"));
}
