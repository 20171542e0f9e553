//! The streaming group of run, chat and serve: `--resident`, or the
//! streaming flags as one clap group (`StreamArgs`) that `--resident`
//! conflicts with as a whole, so a flag added there is refused beside
//! `--resident` without a list to keep. Every default is
//! [`StreamConfig::default`]'s, shown by `--help` and used by a streamed run.
//!
//! Given none of these flags (nor run's `--route-trace` or
//! `--head-predemand`), a MoE model runs resident when its file fits in
//! memory and streams with the defaults otherwise (`bmoe::engine::fits`):
//! any streaming flag given, `--cache-mb auto` included, keeps it streamed.

use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, FromArgMatches};

use bmoe::engine::Asked;
use bmoe::stream::{CacheSize, DenseMode, StreamConfig, WarmSource};
use bmoe_flash::cache::CachePolicy;

/// Resident, or streamed with the cache and I/O flags, or (neither given)
/// resident when the model fits in memory.
#[derive(Debug)]
pub struct StreamingArgs {
    /// `--resident`.
    pub resident: bool,
    pub stream: StreamArgs,
    /// Whether a flag of the streaming group was given on the command line
    /// (a default value is not "given").
    pub stream_given: bool,
}

/// The flags themselves; [`StreamingArgs`] adds which were given.
#[derive(Debug, Args)]
#[command(next_help_heading = "Streaming")]
struct StreamingFlags {
    /// Keep llama.cpp's plain mmap path for the experts (the comparison baseline,
    /// and what a run without streaming flags does when the model file fits in
    /// memory); refused beside any streaming flag.
    #[arg(long, conflicts_with = "StreamArgs")]
    resident: bool,
    #[command(flatten)]
    stream: StreamArgs,
}

impl FromArgMatches for StreamingArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let StreamingFlags { resident, stream } = StreamingFlags::from_arg_matches(m)?;
        Ok(StreamingArgs {
            resident,
            stream,
            stream_given: any_given(m),
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for StreamingArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        StreamingFlags::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        StreamingFlags::augment_args_for_update(cmd)
    }

    fn group_id() -> Option<clap::Id> {
        StreamingFlags::group_id()
    }
}

/// Whether any flag of the streaming group came from the command line (the
/// group's own ids: a flag added to [`StreamArgs`] counts without a list).
fn any_given(m: &ArgMatches) -> bool {
    let group = StreamArgs::augment_args(clap::Command::new("streaming"));
    let any = group.get_arguments().any(|a| {
        let id = a.get_id().as_str();
        matches!(m.try_contains_id(id), Ok(true))
            && m.value_source(id) == Some(ValueSource::CommandLine)
    });
    any
}

/// The streaming settings no flag of this group gives: run's
/// `--route-trace` and the RAM serve's prompt cache holds.
#[derive(Debug, Default)]
pub struct StreamExtras {
    /// Run's `--route-trace FILE`.
    pub route_trace: Option<PathBuf>,
    /// Bytes the expert cache leaves to others (serve's prompt cache RAM).
    pub reserved_bytes: u64,
}

impl StreamingArgs {
    /// Resident, or streamed with these flags and `extras`: with
    /// `--moe-stream` always (a dense model refused), with another streaming
    /// flag or a route trace to record as asked, and with none of them when
    /// the model does not fit (bmoe's choice, [`Asked::Auto`]).
    pub fn mode(&self, extras: StreamExtras) -> Asked {
        if self.resident {
            return Asked::Resident;
        }
        let auto = !self.stream_given && extras.route_trace.is_none();
        let config = StreamConfig {
            route_trace: extras.route_trace,
            reserved_bytes: extras.reserved_bytes,
            ..self.stream.config()
        };
        if self.stream.moe_stream {
            Asked::Stream(config)
        } else if auto {
            Asked::Auto(config)
        } else {
            Asked::StreamMoe(config)
        }
    }
}

/// The defaults, from their one source.
fn defaults() -> StreamConfig {
    StreamConfig::default()
}

/// How the routed experts are streamed (clap group `StreamArgs`).
#[derive(Debug, Args)]
#[command(next_help_heading = "Streaming")]
pub struct StreamArgs {
    /// Stream experts, even when the model file fits in memory (an error for a
    /// dense model). Without any streaming flag a MoE model streams only when
    /// its file does not fit in memory; it runs resident otherwise.
    #[arg(long)]
    pub moe_stream: bool,
    /// Expert cache budget in MiB: 0 re-reads routed slices every token (least RAM),
    /// N keeps (layer, expert) slices within N MiB (evicted by --cache-policy), P% budgets P percent of the
    /// model's expert bytes, auto sizes it from MemAvailable. Given (auto included),
    /// the run streams even when the model fits in memory.
    #[arg(long, value_name = "MIB|P%|auto", default_value_t = defaults().cache)]
    pub cache_mb: CacheSize,
    /// Upper bound for --cache-mb auto, in MiB (default: what the host can spare).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=bmoe::stream::MAX_CACHE_MB))]
    pub cache_ceil_mb: Option<u64>,
    /// Expert reads kept in flight (io_uring queue depth).
    #[arg(long, default_value_t = defaults().io_threads, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub io_threads: u32,
    /// Read experts through the page cache instead of O_DIRECT.
    #[arg(long)]
    pub no_odirect: bool,
    /// Overlap expert reads with compute: wait for the down slices only after the
    /// gate/up matmuls have run (byte-identical to serial).
    #[arg(long)]
    pub overlap: bool,
    /// Temporal prefetch: after layer L is served, read on idle queue slots the
    /// experts layers L+1..L+K used for the previous token (demands go first).
    #[arg(long, value_name = "K", default_value_t = defaults().prefetch, value_parser = clap::value_parser!(u32).range(0..=8))]
    pub prefetch: u32,
    /// Predictive prefetch: score layer L+1's router on layer L's MoE input and
    /// read the experts it names early (lossless: the real routing is served).
    #[arg(long)]
    pub predict_prefetch: bool,
    /// LOSSY: skip a routed expert when it is a cache miss and its router weight
    /// is below F x (1/k); its weight is zeroed and the rest renormalized. 0 is off.
    #[arg(long, value_name = "F", default_value_t = defaults().drop_cold)]
    pub drop_cold_experts: f32,
    /// Testing only: read experts with pread through seeded faults, e.g.
    /// `seed=1,eio=0.001,short=0.05,eagain=0.05,slow=0.01,slow_ms=5`.
    #[arg(long, hide = true, value_name = "SPEC")]
    pub inject_faults: Option<bmoe_flash::FaultPlan>,
    /// Which cached expert slot goes first when the cache is full: lru (least
    /// recently used), lfu (least often used, counts aged), cycle (longest
    /// expected wait to its next use, from the fixed layer order and use counts)
    /// or learned (the lowest chance of reuse at its layer's next visit, learned
    /// online from each slot's recency and frequency, for the wait). `bmoe replay` compares them on a route trace (docs/cache.md).
    #[arg(long, value_name = "POLICY", default_value_t = defaults().policy)]
    pub cache_policy: CachePolicy,
    /// Start the expert cache warm: read the hottest experts of earlier runs
    /// (a profile of their single-token routing) while the prompt is
    /// prefilled, and fold this run's routing into the profile at the end.
    /// auto: the profile kept for this model in the cache directory; FILE:
    /// that profile (refused when it is another model's); off. Streaming with
    /// a cache budget only; never changes the output (docs/cache.md).
    #[arg(long, value_name = "auto|off|FILE", default_value_t = defaults().warm)]
    pub cache_warm: WarmSource,
    /// Pages kept backed ahead of the cache's growth, in MiB: a background
    /// thread faults them in, and a miss that fills a slot never used before
    /// takes them instead of faulting its own in on the read's path (on a VM
    /// whose host takes free memory back that first touch costs about 2 ms a
    /// MiB). 0: off.
    #[arg(long, value_name = "MIB", default_value_t = defaults().pretouch_bytes >> 20, value_parser = clap::value_parser!(u64).range(0..=4096))]
    pub pretouch_mb: u64,
    /// What to do with the dense (non-expert) weights after load.
    #[arg(long, value_enum, default_value_t = defaults().dense)]
    pub dense_weights: DenseMode,
}

impl StreamArgs {
    /// The streaming settings these flags ask for (no route trace, nothing
    /// reserved: see [`StreamingArgs::mode`]).
    pub fn config(&self) -> StreamConfig {
        StreamConfig {
            cache: self.cache_mb,
            cache_ceil_mb: self.cache_ceil_mb,
            io_threads: self.io_threads,
            o_direct: !self.no_odirect,
            dense: self.dense_weights,
            overlap: self.overlap,
            prefetch: self.prefetch,
            predict_prefetch: self.predict_prefetch,
            drop_cold: self.drop_cold_experts,
            faults: self.inject_faults.clone(),
            policy: self.cache_policy,
            route_trace: None,
            warm: self.cache_warm.clone(),
            reserved_bytes: 0,
            pretouch_bytes: self.pretouch_mb << 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use bmoe::engine::Asked;
    use clap::error::ErrorKind;

    /// `bmoe run`'s clap command.
    fn run_command() -> clap::Command {
        crate::cli::args::command()
            .find_subcommand("run")
            .expect("a run subcommand")
            .clone()
    }

    /// The ids of the streaming group's flags.
    fn group_ids() -> Vec<String> {
        let run = run_command();
        let group = run
            .get_groups()
            .find(|g| g.get_id() == "StreamArgs")
            .expect("the StreamArgs group");
        group.get_args().map(|a| a.to_string()).collect()
    }

    /// A value each flag of the group takes (None: a switch).
    fn sample(id: &str) -> Option<&'static str> {
        match id {
            "cache_mb" => Some("64"),
            "cache_ceil_mb" => Some("512"),
            "io_threads" => Some("8"),
            "prefetch" => Some("2"),
            "drop_cold_experts" => Some("0.5"),
            "inject_faults" => Some("seed=1,eio=0.001"),
            "cache_policy" => Some("lfu"),
            "cache_warm" => Some("auto"),
            "dense_weights" => Some("anon"),
            "pretouch_mb" => Some("0"),
            "route_trace" => Some("/tmp/t.bmrt"),
            _ => None,
        }
    }

    #[test]
    fn resident_refuses_every_streaming_flag_by_name() {
        let ids = group_ids();
        assert!(
            ids.len() >= 13,
            "the group holds the streaming flags: {ids:?}"
        );
        let run = run_command();
        // Run's --route-trace streams too: refused beside --resident by name.
        let ids = ids.iter().map(String::as_str).chain(["route_trace"]);
        for id in ids {
            let arg = run
                .get_arguments()
                .find(|a| a.get_id() == id)
                .expect("the group's flag");
            let flag = format!("--{}", arg.get_long().expect("a long flag"));
            let mut argv = vec!["bmoe", "run", "-p", "x", "--resident", flag.as_str()];
            let takes_value = arg.get_action().takes_values();
            if takes_value {
                argv.push(sample(id).unwrap_or_else(|| panic!("a sample value for {id}")));
            }
            let err = crate::cli::args::command()
                .try_get_matches_from(&argv)
                .expect_err(&format!("--resident {flag} is refused"));
            assert_eq!(err.kind(), ErrorKind::ArgumentConflict, "{flag}: {err}");
            assert_eq!(err.exit_code(), 2, "{flag}");
            let text = err.to_string();
            assert!(text.contains(&flag), "{flag} named: {text}");
            // Without --resident the same flag is taken.
            argv.retain(|a| *a != "--resident");
            crate::cli::args::command()
                .try_get_matches_from(&argv)
                .unwrap_or_else(|e| panic!("{argv:?} is taken: {e}"));
        }
    }

    #[test]
    fn any_streaming_flag_given_keeps_the_run_streamed() {
        use super::StreamExtras;
        let plain = crate::cli::args::parse_run(&["bmoe", "run", "-p", "x"]);
        assert!(!plain.streaming.stream_given);
        let mode = |a: &super::StreamingArgs, extras| a.mode(extras);
        assert!(matches!(
            mode(&plain.streaming, StreamExtras::default()),
            Asked::Auto(_)
        ));
        // A route trace records streamed routing: it streams.
        let traced = StreamExtras {
            route_trace: Some("/tmp/t.bmrt".into()),
            ..Default::default()
        };
        assert!(matches!(
            mode(&plain.streaming, traced),
            Asked::StreamMoe(_)
        ));
        // Each flag of the group counts, at its default value too.
        let ids = group_ids();
        let run = run_command();
        for id in &ids {
            let arg = run.get_arguments().find(|a| a.get_id() == id).expect(id);
            let flag = format!("--{}", arg.get_long().expect("a long flag"));
            let mut argv = vec!["bmoe", "run", "-p", "x", flag.as_str()];
            let value;
            if arg.get_action().takes_values() {
                value = arg
                    .get_default_values()
                    .first()
                    .map(|v| v.to_string_lossy().into_owned())
                    .unwrap_or_else(|| sample(id).expect("a sample").to_string());
                argv.push(&value);
            }
            let a = crate::cli::args::parse_run(&argv);
            assert!(a.streaming.stream_given, "{argv:?}");
            // --moe-stream refuses a dense model; the others run it resident.
            let want_explicit = flag == "--moe-stream";
            match mode(&a.streaming, StreamExtras::default()) {
                Asked::Stream(_) => assert!(want_explicit, "{argv:?}"),
                Asked::StreamMoe(_) => assert!(!want_explicit, "{argv:?}"),
                other => panic!("{argv:?}: {other:?}"),
            }
        }
        let resident = crate::cli::args::parse_run(&["bmoe", "run", "-p", "x", "--resident"]);
        assert_eq!(
            mode(&resident.streaming, StreamExtras::default()),
            Asked::Resident
        );
    }

    #[test]
    fn the_help_defaults_are_what_a_run_uses() {
        let args = crate::cli::args::parse_run(&["bmoe", "run", "-p", "x"]);
        let resolved = format!("{:?}", args.streaming.stream.config());
        let default = format!("{:?}", bmoe::stream::StreamConfig::default());
        assert_eq!(
            resolved, default,
            "a run without flags streams with the defaults"
        );
        // Each default the help text shows is the one source's, by name.
        let d = bmoe::stream::StreamConfig::default();
        let expect = [
            ("cache_mb", d.cache.to_string()),
            ("io_threads", d.io_threads.to_string()),
            ("prefetch", d.prefetch.to_string()),
            ("drop_cold_experts", d.drop_cold.to_string()),
            ("cache_policy", d.policy.to_string()),
            ("cache_warm", d.warm.to_string()),
            ("dense_weights", "warm".to_string()),
        ];
        let run = run_command();
        for (id, want) in expect {
            let arg = run.get_arguments().find(|a| a.get_id() == id).expect(id);
            let shown: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            assert_eq!(shown, vec![want], "--help's default of {id}");
        }
        assert_eq!(d.cache, bmoe::stream::CacheSize::Auto, "docs: auto");
        assert_eq!(
            d.policy,
            bmoe_flash::cache::CachePolicy::Learned,
            "docs: learned"
        );
        assert_eq!(
            bmoe_flash::FlashConfig::default().policy,
            d.policy,
            "the flash actor's default policy is the same"
        );
    }
}
