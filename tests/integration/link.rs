//! `--rpc` over a shaped link (docs/scale-out.md): the rpc-server in a
//! network namespace of its own behind a veth pair held to 1 Gbit/s, the
//! client here. Skipped, with the reason printed, where namespaces cannot
//! be made (not root, no `ip` or `tc`).

use crate::common::{bmoe_within, stderr, stdout, zoo_model, PROSE};
use crate::netns::ShapedLink;

fn run(model: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["run", "-m", model, "-p", PROSE, "-n", "12", "-t", "2"];
    args.extend_from_slice(extra);
    bmoe_within(&args, 300)
}

/// The summary's `rpc:` line.
fn rpc_line(err: &str) -> String {
    let l = err.lines().find(|l| l.starts_with("rpc: "));
    l.unwrap_or_else(|| panic!("no rpc line: {err}"))
        .to_string()
}

#[test]
fn a_split_over_a_shaped_1_gbit_link_writes_the_resident_text() {
    let Some(link) = ShapedLink::make("1gbit") else {
        return;
    };
    let server = link.serve(&[]);
    let model = zoo_model("qwen3moe", "q8_0");
    let resident = run(&model, &["--resident"]);
    assert!(resident.status.success(), "{}", stderr(&resident));
    assert!(!stdout(&resident).trim().is_empty());
    let before = link.sent_bytes();
    let rpc = [
        "--rpc",
        &server.addr,
        "--rpc-layers",
        "1",
        "--cache-mb",
        "0",
    ];
    let o = run(&model, &rpc);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}\nserver: {}", server.log());
    assert_eq!(
        stdout(&o),
        stdout(&resident),
        "the split text differs\n{err}"
    );
    assert!(
        err.contains("moe-stream: "),
        "the local layer streamed: {err}"
    );
    // The load and the decodes went through the shaped link: its qdisc sent
    // at least the decodes' part (several hundred KiB a token).
    let sent = link.sent_bytes() - before;
    assert!(sent > 1 << 20, "{sent} bytes through the link");
    // The network bytes per token sit beside what must cross (the
    // activations out, the logits back) and their ratio; a streamed split
    // watches nodes, so each decode resends ggml's serialized graph.
    let streamed = rpc_line(&err);
    assert!(streamed.contains("x the activations out"), "{streamed}");
    // Resident, nothing watches a node: ggml reuses the hosts' graph and a
    // decode sends its inputs only (the first after the prompt excepted).
    let o = run(
        &model,
        &["--rpc", &server.addr, "--rpc-layers", "1", "--resident"],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}\nserver: {}", server.log());
    assert_eq!(stdout(&o), stdout(&resident), "{err}");
    let reused = rpc_line(&err);
    assert!(reused.contains("not timed apart"), "{reused}");
    let (s, r) = (kib_per_token(&streamed), kib_per_token(&reused));
    assert!(s > 0.0 && r < s, "reused {r} KiB/token, streamed {s}");
    assert!(ratio(&reused) < 1.5, "{reused}");
}

/// `network X KiB/token` of an `rpc:` line.
fn kib_per_token(line: &str) -> f64 {
    let after = line.split_once("network ").map_or("", |(_, r)| r);
    after
        .split(' ')
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(-1.0)
}

/// `= R x the activations out` of an `rpc:` line.
fn ratio(line: &str) -> f64 {
    let after = line.split_once("KiB/token = ").map_or("", |(_, r)| r);
    let r = after.split_once("x the activations").map_or("", |(x, _)| x);
    r.parse().unwrap_or(f64::INFINITY)
}
