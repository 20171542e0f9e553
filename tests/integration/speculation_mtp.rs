//! MTP speculation on the tiny qwen35moe fixture with a head: a head set up
//! to agree is accepted, one that disagrees rolls back; `--spec auto` mixes
//! the matcher and the head; a head the gate holds back rests; the head's
//! streamed experts and their failed reads; the refusals.

use std::sync::Arc;

use bmoe::generate::{self, Drafter, Follow};
use bmoe::lab::compare::RunCsv;
use bmoe::llama::{Context, ContextParams, Model, ModelParams, Target, Token};

use super::speculation::copy_prompt;
use crate::common::*;

/// `bmoe run` on a tiny MTP model, resident.
fn tiny_cli(model: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["--resident"];
    args.extend_from_slice(extra);
    tiny_run(model, &args)
}

/// `bmoe run` on a tiny MTP model with `extra` flags (64 tokens, 180 s at most).
fn tiny_run(model: &std::path::Path, extra: &[&str]) -> std::process::Output {
    crate::common::tiny_run_n(model, 64, extra)
}

fn trailer(csv: &std::path::Path) -> std::collections::BTreeMap<String, String> {
    RunCsv::open(csv).unwrap().trailer
}

#[test]
fn mtp_head_set_up_to_agree_is_accepted_and_keeps_the_text() {
    let model = tiny_mtp(0.0, 0.0);
    let plain = tiny_cli(&model, &[]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("mtp.csv");
    let o = tiny_cli(
        &model,
        &["--mtp", "--draft", "3", "--csv", csv.to_str().unwrap()],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(stdout(&o), stdout(&plain), "speculated text = plain text");
    let t = trailer(&csv);
    let n = |k: &str| t[k].parse::<f64>().unwrap();
    let acceptance = n("mtp_accepted") / n("mtp_drafted");
    assert!(acceptance >= 0.9, "acceptance {acceptance}: {err}");
    let c = RunCsv::open(&csv).unwrap();
    let per_decode = c.decode_series("wall_ms").len() as f64 / n("mtp_decodes");
    assert!(
        per_decode >= 2.5,
        "tokens per verify decode {per_decode}: {err}"
    );
    assert_eq!(c.preamble["spec"], "mtp");
    assert!(err.contains("mtp: draft 3: acceptance"), "{err}");
    assert!(err.contains("mtp-cost: drafting"), "{err}");
    // Behind the gate, the head's drafts keep the text too.
    let gated = tiny_cli(&model, &["--spec", "mtp", "--draft", "3"]);
    let err = stderr(&gated);
    assert!(gated.status.success(), "{err}");
    assert_eq!(
        stdout(&gated),
        stdout(&plain),
        "gated MTP text = plain text"
    );
    assert!(err.contains("spec-gate: verified drafts on "), "{err}");
}

/// `bmoe run` on a tiny MTP model, resident, with `prompt`.
fn tiny_prompt(model: &std::path::Path, prompt: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["run", "-m", model.to_str().unwrap(), "-p", prompt];
    args.extend_from_slice(&["-n", "64", "--resident"]);
    args.extend_from_slice(extra);
    crate::common::bmoe_within(&args, 180)
}

#[test]
fn spec_auto_mixes_the_matcher_and_the_head_and_keeps_the_text() {
    let model = tiny_mtp(0.0, 0.0);
    // The tiny trunk's next token depends on the current one alone, so a
    // prompt that ends as an earlier part of it did continues as that part
    // did: the matcher has drafts there, and none once the text is new.
    let first = stdout(&tiny_cli(&model, &[]));
    let base = "The quick brown fox jumps over the lazy dog";
    let copied: String = first.chars().take(60).collect();
    let prompt = format!("{base}{copied}. {base}");
    let plain = tiny_prompt(&model, &prompt, &[]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("auto.csv");
    let args = [
        "--spec",
        "auto",
        "--draft",
        "3",
        "--csv",
        csv.to_str().unwrap(),
    ];
    let o = tiny_prompt(&model, &prompt, &args);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(stdout(&o), stdout(&plain), "auto text = plain text");
    let c = RunCsv::open(&csv).unwrap();
    assert_eq!(
        (&*c.preamble["spec"], &*c.preamble["spec_gate"]),
        ("auto", "1")
    );
    let (source, k) = (c.decode_series("gate_source"), c.decode_series("gate_k"));
    let rows = |s: f64, drafted: bool| {
        let n = source
            .iter()
            .zip(&k)
            .filter(|(x, k)| **x == s && (**k > 0.0) == drafted);
        n.count()
    };
    // The head's pass costs about a decode of this 2-layer trunk, so the gate
    // holds most of its drafts back; the matcher's are nearly free.
    assert!(rows(1.0, true) > 0, "the matcher drafted: {err}");
    assert!(
        rows(2.0, true) + rows(2.0, false) > 0,
        "the head was judged: {err}"
    );
    // A verify step's first row names its source (unless nothing fit, as
    // for the last token); the group's other rows carry no gate columns.
    let batch = c.decode_series("mtp_batch");
    assert!(
        source
            .iter()
            .zip(&batch)
            .all(|(s, b)| *s == 0.0 || *b > 0.0),
        "{source:?} {batch:?}"
    );
    let t = |key: &str| c.trailer[key].parse::<f64>().unwrap();
    assert_eq!(k.iter().sum::<f64>(), t("mtp_drafted"));
    // A model without a head: the matcher alone, said once.
    let o = e8k2_cli(copy_prompt(), 24, &["--resident", "--spec", "auto"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("note: --spec auto:") && err.contains("has no MTP head"),
        "{err}"
    );
}

/// The real MTP head, made dear to draft (a sleep per drafting call) and
/// always wrong (a first draft equal to the known text is changed), with its
/// catch-ups and forgettings counted.
struct DearHead {
    head: generate::MtpDrafter,
    /// The prompt and the plain run's text: what the target will confirm.
    truth: Vec<Token>,
    caught_up: usize,
    forgot: usize,
}

impl<'t> Drafter<'t> for DearHead {
    fn draft(
        &mut self,
        target: &mut Target<'t>,
        corpus: &[Token],
        max: usize,
    ) -> Result<Vec<Token>, generate::GenerateError> {
        std::thread::sleep(std::time::Duration::from_millis(40));
        let mut draft = self.head.draft(target, corpus, max)?;
        // The token the target will confirm after `corpus` (exactness keeps
        // the gated text equal to the plain one).
        let next = self.truth.get(corpus.len()).copied();
        if let (Some(first), Some(next)) = (draft.first_mut(), next) {
            if *first == next {
                *first = if next == 0 { 1 } else { next - 1 };
            }
        }
        Ok(draft)
    }
    fn follow(
        &mut self,
        target: &mut Target<'t>,
        event: Follow<'_>,
    ) -> Result<(), generate::GenerateError> {
        match event {
            Follow::Decoded(_) => self.caught_up += 1,
            Follow::Forget => self.forgot += 1,
            Follow::Begin(_) | Follow::Accepted(_) => {}
        }
        self.head.follow(target, event)
    }
}

#[test]
fn a_head_the_gate_holds_back_rests_wakes_and_keeps_the_text() {
    use bmoe::llama::{ContextKind, MtpHead, TargetTurn};
    // A head that is always wrong (and dear): drafting never pays, whatever
    // a decode costs on this host at the moment.
    let path = tiny_mtp(4.0, 0.25);
    // Without its block loaded, an MTP context is refused (llama.cpp would abort).
    let bare = Arc::new(Model::load(&path, &ModelParams::default()).unwrap());
    let refused = Context::new(
        bare,
        ContextParams {
            kind: ContextKind::Mtp,
            ..ContextParams::default()
        },
    );
    assert!(
        refused.is_err_and(|e| e.to_string().contains("load_mtp")),
        "an MTP context on a model loaded without its block is an error"
    );
    let load = ModelParams {
        load_mtp: true,
        ..ModelParams::default()
    };
    let model = Arc::new(Model::load(&path, &load).unwrap());
    let prompt = generate::prompt_tokens(&model, "The quick brown fox", None).unwrap();
    let n = 72;
    let params = || ContextParams {
        n_ctx: 512,
        n_rs_seq: 3,
        ..ContextParams::default()
    };
    let mut ctx = Context::new(model.clone(), params()).unwrap();
    let plain =
        generate::generate_with(&mut ctx, &prompt, n, 512, &mut |_: &str| {}, None, 0).unwrap();
    let mut ctx = Context::new(model.clone(), params()).unwrap();
    let draft_params = ContextParams {
        kind: ContextKind::Mtp,
        ..params()
    };
    let draft = Context::new(model.clone(), draft_params).unwrap();
    let head = MtpHead::new(&mut TargetTurn::new(&mut ctx), draft, 3, 0.0).unwrap();
    let mut dear = DearHead {
        head: generate::MtpDrafter::new(head),
        truth: [prompt.as_slice(), plain.tokens.as_slice()].concat(),
        caught_up: 0,
        forgot: 0,
    };
    let sources = generate::Sources::One(&mut dear, bmoe_decode::spec_gate::Source::Mtp);
    let mut gated = generate::GatedDrafter::new(sources, 3);
    let g = generate::generate_with(
        &mut ctx,
        &prompt,
        n,
        512,
        &mut |_: &str| {},
        Some(&mut gated),
        3,
    )
    .unwrap();
    let stats = gated.stats;
    assert_eq!(g.tokens, plain.tokens, "gated text = plain text");
    // Its drafts are rejected and a drafting call costs more than a decode:
    // after its first drafts the gate holds the head back, so it rests, and the exploration every
    // EXPLORE_EVERY plain steps wakes it (one plain step) before it drafts.
    assert!(stats.rested > 0 && stats.woke >= 1, "{stats:?}");
    assert!(stats.explored >= 1, "{stats:?}");
    assert!(
        dear.forgot >= 1 && dear.forgot as u64 <= stats.woke + 1,
        "{stats:?}"
    );
    // It caught up on the prompt and on every step it was not resting (the
    // last decode, after the last gated step, follows the last state).
    let steps = (stats.steps - stats.rested) as usize;
    assert!(
        (steps..=steps + 1).contains(&(dear.caught_up - 1)),
        "caught up {} times: {stats:?}",
        dear.caught_up
    );
}

#[test]
fn mtp_head_that_disagrees_rolls_back_the_hybrid_layers_and_keeps_the_text() {
    // A noisy head over a context-dependent trunk (gated delta net + attention):
    // most drafts are rejected, so the target's recurrent state is rolled back
    // through its snapshots on most steps.
    for (noise, mix) in [(4.0, 0.25), (2.0, 0.25)] {
        let model = tiny_mtp(noise, mix);
        let plain = tiny_cli(&model, &[]);
        assert!(plain.status.success(), "{}", stderr(&plain));
        let dir = tempfile::tempdir().unwrap();
        for width in ["1", "3"] {
            let csv = dir.path().join(format!("mtp-{width}.csv"));
            let o = tiny_cli(
                &model,
                &["--mtp", "--draft", width, "--csv", csv.to_str().unwrap()],
            );
            let err = stderr(&o);
            assert!(o.status.success(), "{err}");
            assert_eq!(
                stdout(&o),
                stdout(&plain),
                "noise {noise} mix {mix} draft {width}"
            );
            let t = trailer(&csv);
            let n = |k: &str| t[k].parse::<u64>().unwrap();
            assert!(n("mtp_drafted") > 0, "{err}");
            assert!(
                n("mtp_accepted") < n("mtp_drafted"),
                "some drafts rejected (rollback exercised): {err}"
            );
        }
    }
}

#[test]
fn mtp_refusals_name_the_fix() {
    let o = e8k2_cli("hi", 4, &["--resident", "--mtp"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no MTP") || stderr(&o).contains("has none"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("--ngram"), "{}", stderr(&o));
    let o = e8k2_cli("hi", 4, &["--mtp", "--ngram"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
    let model = tiny_mtp(0.0, 0.0);
    let m = model.to_str().unwrap();
    let o = bmoe(&[
        "run",
        "-m",
        m,
        "-p",
        "hi",
        "-n",
        "4",
        "--resident",
        "--mtp",
        "--mtp-p-min",
        "1.5",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--mtp-p-min"), "{}", stderr(&o));
    let o = e8k2_cli("hi", 4, &["--head-predemand"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--mtp"), "{}", stderr(&o));
}

#[test]
fn mtp_streams_the_heads_experts_and_reports_the_flash_split() {
    let model = tiny_mtp(0.0, 0.25);
    let plain = tiny_cli(&model, &[]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let dir = tempfile::tempdir().unwrap();
    // A streamed MTP run at cache 0 with `flags`: its text must be the resident
    // plain text; returns its stderr and CSV.
    let run = |name: &str, flags: &[&str]| {
        let csv = dir.path().join(format!("{name}.csv"));
        let mut args = vec!["--cache-mb", "0", "--mtp"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--csv", csv.to_str().unwrap()]);
        let o = tiny_run(&model, &args);
        let err = stderr(&o);
        assert!(o.status.success(), "{name}: {err}");
        assert_eq!(
            stdout(&o),
            stdout(&plain),
            "{name}: text = resident plain text"
        );
        (err, RunCsv::open(&csv).unwrap())
    };
    let n = |c: &RunCsv, k: &str| c.trailer[k].parse::<u64>().unwrap();

    let (err, on) = run("d3-pre", &["--draft", "3", "--head-predemand"]);
    assert!(
        n(&on, "mtp_head_read_bytes") > 0,
        "the head's experts were streamed: {err}"
    );
    assert!(n(&on, "mtp_accepted") > 0, "{err}");
    let split = err
        .lines()
        .find(|l| l.starts_with("mtp-flash: the head ("))
        .unwrap_or_else(|| panic!("no flash split line: {err}"));
    assert!(split.contains("% of head + verify"), "{split}");
    // The head ran on the draft actor's thread with its own hook: its demands
    // are counted there.
    assert!(
        n(&on, "mtp_head_hits") + n(&on, "mtp_head_misses") > 0,
        "{err}"
    );
    assert!(err.contains("mtp-head: on the draft actor:"), "{err}");
    assert_eq!(on.preamble["mtp_head_predemand"], "1");

    // Without the pre-demand (the default): same text, nothing read during the
    // verify decodes, and fewer of the catch-up's experts already resident.
    let (_, off) = run("d3", &["--draft", "3"]);
    assert!(n(&on, "mtp_head_predemand_bytes") > 0, "{err}");
    assert_eq!(n(&off, "mtp_head_predemand_bytes"), 0);
    assert_eq!(off.preamble["mtp_head_predemand"], "0");
    assert!(
        n(&on, "mtp_head_hits") > n(&off, "mtp_head_hits"),
        "the pre-demand makes the catch-up's experts resident: {:?} vs {:?}",
        on.trailer,
        off.trailer
    );

    // With the dense weights in anonymous memory, the head's own dense tensors
    // are copied too (one shared store) and the text is still the plain one.
    let (_, anon) = run("d2-anon", &["--draft", "2", "--dense-weights", "anon"]);
    assert!(n(&anon, "mtp_accepted") > 0);
}

#[test]
fn a_failed_read_of_the_heads_experts_is_the_error_reported() {
    // Seeded EIO faults hit the verify decode's reads or the head's (its block
    // is layer 2); when the head's read fails, the run must end with that read's
    // error, not with llama.cpp's status code from the aborted head decode.
    let model = tiny_mtp(0.0, 0.0);
    let mut head_failures = 0;
    for seed in 1..=12 {
        let faults = format!("seed={seed},eio=0.02");
        let o = tiny_run(
            &model,
            &["--cache-mb", "0", "--mtp", "--inject-faults", &faults],
        );
        let err = stderr(&o);
        let Some(first) = err
            .lines()
            .find_map(|l| l.split("expert read for layer ").nth(1))
        else {
            assert!(o.status.success(), "seed {seed}: {err}");
            continue;
        };
        assert_eq!(o.status.code(), Some(1), "seed {seed}: {err}");
        if first.starts_with("2 ") {
            head_failures += 1;
            let last = err.lines().last().unwrap_or_default();
            assert!(
                last.contains("the MTP head's expert streaming failed: expert read for layer 2"),
                "seed {seed}: {last}"
            );
        }
    }
    assert!(head_failures > 0, "no seed failed a head read");
}
