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
    // The network bytes per token sit beside what must cross: the
    // activations out and the logits back, and their ratio.
    let line = rpc_line(&err);
    assert!(!line.contains("network 0.0 KiB"), "{line}");
    assert!(line.contains("x the activations out"), "{line}");
}
