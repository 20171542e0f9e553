//! `bmoe run` and `bmoe inspect` on real models.

use std::sync::Arc;

use bmoe::chat::ChatTemplate;
use bmoe::generate;
use bmoe::llama::{Context, ContextParams, Model, ModelParams};

use crate::common::{bmoe, e8k2, smollm2, stderr, stdout};

const QUESTION: &str = "What is the capital of France? Answer in one sentence.";

#[test]
fn dense_smollm2_answers_the_capital_question() {
    let o = bmoe(&[
        "run",
        "-m",
        smollm2().to_str().unwrap(),
        "--chat",
        "-p",
        QUESTION,
        "-n",
        "32",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "The capital of France is Paris.");
    assert!(stderr(&o).contains("generation:"), "{}", stderr(&o));
}

#[test]
fn upcycled_e8k2_answers_the_capital_question() {
    // By default (it fits in memory: resident) and streamed.
    for extra in [&[][..], &["--cache-mb", "auto"]] {
        let m = e8k2().to_str().unwrap();
        let mut args = vec!["run", "-m", m, "--chat", "-p", QUESTION, "-n", "32"];
        args.extend_from_slice(extra);
        let o = bmoe(&args);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        assert_eq!(stdout(&o).trim(), "The capital of France is Paris.");
    }
}

#[test]
fn prompt_from_file_and_token_limit() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("prompt.txt");
    std::fs::write(&f, "Once upon a time").unwrap();
    let o = bmoe(&[
        "run",
        "-m",
        smollm2().to_str().unwrap(),
        "-f",
        f.to_str().unwrap(),
        "-n",
        "5",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("5 generated (token limit)"),
        "{}",
        stderr(&o)
    );
    assert!(!stdout(&o).trim().is_empty());
}

#[test]
fn library_generation_is_deterministic_and_matches_the_cli() {
    let model = Arc::new(Model::load(e8k2(), &ModelParams::default()).unwrap());
    let tokens =
        generate::prompt_tokens(&model, QUESTION, Some(&ChatTemplate::of(&model, None))).unwrap();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut ctx = Context::new(model.clone(), ContextParams::default()).unwrap();
        let g = generate::generate(&mut ctx, &tokens, 16, 512, &mut |_: &str| {}).unwrap();
        runs.push(g);
    }
    assert_eq!(runs[0].tokens, runs[1].tokens);
    assert_eq!(runs[0].text, "The capital of France is Paris.");
    assert_eq!(runs[0].stop, generate::StopReason::EndOfText);
}

#[test]
fn two_decodes_of_one_model_at_once_are_refused() {
    let model = Arc::new(Model::load(e8k2(), &ModelParams::default()).unwrap());
    let tokens =
        generate::prompt_tokens(&model, QUESTION, Some(&ChatTemplate::of(&model, None))).unwrap();
    let mut ctx = Context::new(model.clone(), ContextParams::default()).unwrap();
    // Another context of the model is decoding (it holds the turn).
    let turn = model.decode_turn().unwrap();
    assert!(matches!(
        model.decode_turn(),
        Err(bmoe::llama::LlamaError::ConcurrentDecode)
    ));
    let e = generate::generate(&mut ctx, &tokens, 4, 512, &mut |_: &str| {}).unwrap_err();
    assert!(e.to_string().contains("decoded at once"), "{e}");
    drop(turn);
    ctx.clear();
    let g = generate::generate(&mut ctx, &tokens, 4, 512, &mut |_: &str| {}).unwrap();
    assert_eq!(g.tokens.len(), 4);
}

#[test]
fn inspect_reports_the_moe_layout() {
    let o = bmoe(&["inspect", e8k2().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    for want in [
        "arch:             llama",
        "layers:           30 trunk + 0 nextn",
        "n_expert:         8",
        "n_expert_used:    2",
        "expert slice gate: 552960 bytes (q4_1)",
        "expert slice down: 552960 bytes (q4_1)",
        "alignment:        4096",
        // 30 layers x 2 experts x 3 x 552960
        "routed bytes/tok: 99532800",
    ] {
        assert!(s.contains(want), "missing {want:?} in\n{s}");
    }
}

#[test]
fn inspect_a_dense_model_says_it_has_no_experts() {
    let o = bmoe(&["inspect", smollm2().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("experts:          none"),
        "{}",
        stdout(&o)
    );
}

/// `run --chat` renders through the model's Jinja template (content that
/// looks like Jinja stays text), `--chat-template-file` replaces it, and
/// `--show-prompt` prints the prompt and its token count without generating.
#[test]
fn show_prompt_prints_what_run_chat_renders() {
    let m = e8k2().to_str().unwrap();
    let o = bmoe(&[
        "run",
        "-m",
        m,
        "--chat",
        "-p",
        "Hi {{ x }}",
        "--show-prompt",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi {{ x }}<|im_end|>\n<|im_start|>assistant\n"
    );
    assert!(stderr(&o).contains(" prompt tokens)"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("generated"), "nothing is generated");

    // Mistral-Small-3.1's default system prompt: the date of today, the
    // string literal's backslash-continued lines joined as jinja2 joins them.
    let t = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/templates/mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja"
    );
    let args = ["run", "-m", m, "--chat", "-p", "Hi", "--show-prompt"];
    let o = bmoe(&[&args[..], &["--chat-template-file", t]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    assert!(
        out.contains(&format!("The current date is {today}.When")),
        "{out}"
    );
    assert!(
        out.contains("headquartered in Paris.Your knowledge"),
        "{out}"
    );
    assert!(out.ends_with("[/SYSTEM_PROMPT][INST]Hi[/INST]"), "{out}");

    // A template that refuses the conversation, or is not Jinja: exit 2 with
    // the template's own words, in --show-prompt and in a run alike.
    let dir = tempfile::tempdir().unwrap();
    let refusing = dir.path().join("refusing.jinja");
    std::fs::write(&refusing, "{{ raise_exception('roles must alternate') }}").unwrap();
    let broken = dir.path().join("broken.jinja");
    std::fs::write(&broken, "{% if %}").unwrap();
    for (t, words) in [
        (&refusing, "roles must alternate"),
        (&broken, "not valid Jinja"),
    ] {
        for show in [true, false] {
            let mut a = vec!["run", "-m", m, "--chat", "-p", "Hi", "-n", "2"];
            a.extend(["--chat-template-file", t.to_str().unwrap()]);
            a.extend(show.then_some("--show-prompt"));
            let o = bmoe(&a);
            assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
            assert!(stderr(&o).contains(words), "{}", stderr(&o));
        }
    }
}

/// What a run refuses, --show-prompt refuses too, with the same exit code 2:
/// an empty rendered prompt (in a run as well, once exit 1), a prompt longer
/// than -c (once printed with exit 0); and it names the outputs it would
/// never write (--csv, --route-trace, once ignored).
#[test]
fn show_prompt_refuses_what_a_run_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let m = e8k2().to_str().unwrap();
    let empty = dir.path().join("empty.jinja");
    std::fs::write(&empty, "{# renders nothing #}").unwrap();
    let empty = empty.to_str().unwrap();
    let chat = [
        "run",
        "-m",
        m,
        "--chat",
        "-p",
        "Hi",
        "--chat-template-file",
        empty,
    ];
    for extra in [&["--show-prompt"][..], &["-n", "2", "-t", "2"][..]] {
        let o = bmoe(&[&chat[..], extra].concat());
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("the prompt is empty"), "{}", stderr(&o));
    }

    let long = "word ".repeat(400);
    let o = bmoe(&["run", "-m", m, "-p", &long, "-c", "16", "--show-prompt"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("but the context holds 256"),
        "{}",
        stderr(&o)
    );

    let csv = dir.path().join("t.csv");
    let trace = dir.path().join("t.routes");
    for (flag, path) in [("--csv", &csv), ("--route-trace", &trace)] {
        let p = path.to_str().unwrap();
        let o = bmoe(&["run", "-m", m, "-p", "Hi", "--show-prompt", flag, p]);
        assert_eq!(o.status.code(), Some(2), "{flag}: {}", stderr(&o));
        assert!(stderr(&o).contains(flag), "{}", stderr(&o));
        assert!(!path.exists(), "{flag}: nothing written");
    }
}

/// A refusal ran nothing: no `BMOE_DONE` line a script could take for a run.
#[test]
fn a_refused_run_prints_no_done_line() {
    let long = "word ".repeat(600);
    let o = bmoe(&[
        "run",
        "-m",
        e8k2().to_str().unwrap(),
        "-p",
        &long,
        "-c",
        "64",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!stderr(&o).contains("BMOE_DONE"), "{}", stderr(&o));
}

/// Each command's help lists only the flags it takes (chat and serve once
/// listed about 20 of run's that they then refused; later hid them and
/// refused them after parsing; now they do not have them). The clap tree
/// itself is walked by `cli::flag_tree`'s unit tests.
#[test]
fn each_commands_help_lists_only_what_it_takes() {
    let help = |cmd: &str| crate::common::stdout(&bmoe(&[cmd, "--help"]));
    let run = help("run");
    for flag in ["--prompt", "--csv", "--ngram", "--stop", "--show-prompt"] {
        assert!(run.contains(flag), "run --help: {flag}");
    }
    let (chat, serve) = (help("chat"), help("serve"));
    assert!(run.contains("--prompt-cache-file <FILE>"), "{run}");
    assert!(serve.contains("--prompt-cache <DIR|off>"), "{serve}");
    assert!(!run.contains("--prompt-cache <"), "{run}");
    assert!(!chat.contains("--prompt-cache"), "{chat}");
    for flag in [
        "--prompt ",
        "--file",
        "--chat ",
        "--csv",
        "--progress",
        "--route-trace",
        "--mtp",
        "--spec",
        "--ignore-eos",
        "--show-prompt",
    ] {
        assert!(!chat.contains(flag), "chat --help lists {flag}:\n{chat}");
        assert!(!serve.contains(flag), "serve --help lists {flag}:\n{serve}");
    }
    // Chat and serve draft with the n-gram matcher alone.
    for flag in ["--ngram", "--draft"] {
        assert!(chat.contains(flag), "chat --help: {flag}");
        assert!(serve.contains(flag), "serve --help: {flag}");
    }
    assert!(!serve.contains("--stop"), "{serve}");
    assert!(
        chat.contains("--stop") && chat.contains("--system"),
        "{chat}"
    );
    for flag in ["--cache-mb", "--chat-template-file", "--temp"] {
        assert!(chat.contains(flag) && serve.contains(flag), "{flag}");
    }
    // A flag of another command is a usage error while parsing (it was
    // parsed, then refused after), before any model is looked for.
    for argv in [
        &["serve", "-p", "x"][..],
        &["serve", "--stop", "x"],
        &["chat", "--csv", "t.csv"],
        &["chat", "--mtp"],
    ] {
        let o = bmoe(argv);
        let err = crate::common::stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{argv:?}: {err}");
        let named = format!("unexpected argument '{}'", argv[1]);
        assert!(err.contains(&named), "{argv:?}: {err}");
    }
}
