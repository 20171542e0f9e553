//! Tests over the clap tree: run, chat and serve each take exactly the
//! groups they compose (`-n` is one group all three share), hide none of
//! them, and refuse another command's flags while parsing (exit 2, the flag
//! named).

use std::collections::BTreeSet;

use clap::error::ErrorKind;
use clap::Args;

use super::generation::{GenerationArgs, OutputArgs};
use super::model::ModelArgs;
use super::prompt_cache::PromptCacheArgs;
use super::sampling::SamplingArgs;
use super::spec::{ChatSpecArgs, SpecArgs};
use super::stream::StreamingArgs;
use super::tokens::TokensArg;

/// A group's `clap::Args::augment_args`.
type Augment = fn(clap::Command) -> clap::Command;

/// Hidden on purpose: testing only (docs/reliability.md).
const HIDDEN: [&str; 1] = ["inject_faults"];

/// The ids of a group's arguments.
fn ids_of(cmd: clap::Command) -> BTreeSet<String> {
    cmd.get_arguments()
        .map(|a| a.get_id().to_string())
        .collect()
}

/// The ids of the groups `augment`s add, and the command's own `extra`.
fn union(groups: &[Augment], extra: &[&str]) -> BTreeSet<String> {
    let mut ids: BTreeSet<String> = extra.iter().map(|s| s.to_string()).collect();
    for augment in groups {
        ids.extend(ids_of(augment(clap::Command::new("group"))));
    }
    ids
}

/// The subcommand `name` of bmoe's command line.
fn subcommand(name: &str) -> clap::Command {
    super::args::command()
        .find_subcommand(name)
        .unwrap_or_else(|| panic!("a {name} subcommand"))
        .clone()
}

/// What each command composes: the three shared groups and its own.
fn expected(name: &str) -> BTreeSet<String> {
    let shared: [Augment; 4] = [
        TokensArg::augment_args,
        ModelArgs::augment_args,
        StreamingArgs::augment_args,
        SamplingArgs::augment_args,
    ];
    let (own, extra): (Vec<Augment>, &[&str]) = match name {
        "run" => (
            vec![
                GenerationArgs::augment_args,
                OutputArgs::augment_args,
                SpecArgs::augment_args,
            ],
            &[],
        ),
        "chat" => (
            vec![ChatSpecArgs::augment_args],
            &["stop", "system", "resume"],
        ),
        "serve" => (
            vec![PromptCacheArgs::augment_args, ChatSpecArgs::augment_args],
            &[
                "host",
                "port",
                "parallel",
                "queue",
                "api_key",
                "body_limit_kb",
                "served_name",
            ],
        ),
        other => panic!("not a generating command: {other}"),
    };
    union(&[&shared[..], &own].concat(), extra)
}

#[test]
fn each_command_takes_exactly_its_groups_and_hides_none() {
    for name in ["run", "chat", "serve"] {
        let cmd = subcommand(name);
        assert_eq!(ids_of(cmd.clone()), expected(name), "bmoe {name}'s flags");
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            assert_eq!(
                arg.is_hide_set(),
                HIDDEN.contains(&id),
                "{name}: {id} hidden"
            );
        }
    }
}

/// One long name, one meaning: a flag two commands share takes the same
/// value there (`--prompt-cache` was a FILE on run and a DIR on serve).
#[test]
fn a_flag_shared_by_two_commands_takes_the_same_value_in_both() {
    let value = |a: &clap::Arg| format!("{:?}", a.get_value_names());
    let mut seen = std::collections::BTreeMap::new();
    for name in ["run", "chat", "serve"] {
        for arg in subcommand(name).get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let v = value(arg);
            let first = seen.entry(long.to_string()).or_insert((name, v.clone()));
            assert_eq!(first.1, v, "--{long}: {} on {}, {name}", first.1, first.0);
        }
    }
    let takes = |cmd: &str, long: &str| -> Option<String> {
        let c = subcommand(cmd);
        let found = c.get_arguments().find(|a| a.get_long() == Some(long));
        found.map(value)
    };
    assert_eq!(
        takes("run", "prompt-cache-file").as_deref(),
        Some("Some([\"FILE\"])")
    );
    assert_eq!(
        takes("serve", "prompt-cache").as_deref(),
        Some("Some([\"DIR|off\"])")
    );
    assert_eq!(takes("run", "prompt-cache"), None);
}

#[test]
fn another_commands_flag_is_a_usage_error_naming_it() {
    let refused: [&[&str]; 10] = [
        &["serve", "-p", "x"],
        &["serve", "--stop", "x"],
        &["serve", "--csv", "t.csv"],
        &["serve", "--route-trace", "t.bmrt"],
        &["serve", "--mtp"],
        &["chat", "--csv", "t.csv"],
        &["chat", "--prompt-cache", "state.bpc"],
        &["chat", "--route-from", "t.trace"],
        &["chat", "--show-prompt"],
        &["run", "-p", "x", "--prompt-cache", "state.bpc"],
    ];
    for argv in refused {
        let flag = argv.iter().rfind(|a| a.starts_with('-')).expect("a flag");
        let e = super::args::command()
            .try_get_matches_from([&["bmoe"][..], argv].concat())
            .expect_err(&format!("{argv:?} is refused"));
        assert_eq!(e.kind(), ErrorKind::UnknownArgument, "{argv:?}: {e}");
        assert_eq!(e.exit_code(), 2, "{argv:?}");
        let text = e.to_string();
        assert!(text.contains(&format!("'{flag}'")), "{flag} named: {text}");
    }
}
