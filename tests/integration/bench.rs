//! `bmoe bench` end to end on E8K2: the matrix runs interleaved with the
//! baseline twice, every run keeps its CSV, summary.md has the bound, the
//! cells and the memory check; bad plans are refused before any run; the
//! balloon holds what it is asked and lets it go; the busy neighbour's runs
//! are flagged.

use crate::common::*;

pub(crate) fn read(p: &std::path::Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// The summary's cells-table row of `cell`, split into cells.
pub(crate) fn row<'a>(summary: &'a str, cell: &str) -> Vec<&'a str> {
    let line = summary
        .lines()
        .find(|l| l.starts_with(&format!("| {cell} ")))
        .unwrap_or_else(|| panic!("no row for {cell} in\n{summary}"));
    line.split('|').map(str::trim).collect()
}

/// `bmoe bench` on E8K2 with `cells` (written to DIR/cells.txt), output in
/// DIR/out, a short probe, and `extra` flags; at most 300 s.
pub(crate) fn bench_e8k2(
    dir: &std::path::Path,
    cells: &str,
    extra: &[&str],
) -> std::process::Output {
    let cells_path = dir.join("cells.txt");
    std::fs::write(&cells_path, cells).unwrap();
    let out = dir.join("out");
    let mut args = vec![
        "bench",
        "-m",
        e8k2().to_str().unwrap(),
        "--cells",
        cells_path.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--probe-seconds",
        "0.2",
    ];
    args.extend_from_slice(extra);
    bmoe_within(&args, 300)
}

#[test]
fn bench_runs_the_matrix_interleaved_against_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // A question without --chat: the model ends its text at once, so the bench
    // must measure over -n tokens anyway (--ignore-eos on every run).
    let question = dir.path().join("question.txt");
    std::fs::write(&question, "What is the capital of France?").unwrap();
    let o = bench_e8k2(
        dir.path(),
        "# baseline first\nserial: --cache-mb 0\nhalf: --cache-mb 50% --overlap --predict-prefetch\nres: --resident\n",
        &["-n", "8", "--probe-depths", "1,4", "-w", question.to_str().unwrap()],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    // Progress per run, in ABAB order with the baseline last again.
    let progress: Vec<&str> = err.lines().filter(|l| l.starts_with("bench: [")).collect();
    assert_eq!(progress.len(), 4, "{err}");
    for (line, want) in progress.iter().zip([
        "round 1 serial:",
        "round 1 half:",
        "round 1 res:",
        "round 2 serial:",
    ]) {
        assert!(line.contains(want), "{line} should be {want}");
    }
    // The bound is probed in each round, the baseline's extra run being a round of its own.
    let probes = err
        .lines()
        .filter(|l| l.starts_with("bench: round "))
        .count();
    assert_eq!(probes, 2, "{err}");
    // Every run kept its CSV, and it parses.
    for stem in ["serial-1", "serial-2", "half-1", "res-1"] {
        let csv = out.join("runs").join(format!("{stem}.csv"));
        let c = bmoe::lab::compare::RunCsv::open(&csv).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.trailer["tokens"], "8", "{stem}: exactly -n tokens");
    }
    // 50% of the expert bytes, resolved in the preamble.
    let half = bmoe::lab::compare::RunCsv::open(&out.join("runs/half-1.csv")).unwrap();
    let layout = bmoe::layout::MoeLayout::open(e8k2()).unwrap();
    let want_mb = layout.expert_bytes() / 2 / (1024 * 1024);
    assert_eq!(half.preamble["cache_mb"], want_mb.to_string());
    assert!(half.trailer["peak_rss_bytes"].parse::<u64>().unwrap() > 0);

    let summary = read(&out.join("summary.md"));
    assert!(
        summary.contains(
            "| round | routed d1 MiB/s | routed d4 MiB/s | cache 50% learned d1 MiB/s | \
             cache 50% learned d4 MiB/s | resident tok/s |"
        ),
        "a probe per set and depth:\n{summary}"
    );
    assert!(
        summary.contains("- resident: "),
        "the probe's spread:\n{summary}"
    );
    assert!(
        summary.contains("- bench overhead: 2 probe steps took"),
        "{summary}"
    );
    // The probe reads what the workload routes to (a subset of the file's
    // slices, traced by a run that is not one of the cells'), and for the
    // 50% cell the fewer slices its cache misses on.
    let pairs = 8 * bmoe::layout::MoeLayout::open(e8k2()).unwrap().n_layer as usize;
    let set = |name: &str| -> (usize, usize) {
        let line = summary
            .lines()
            .find(|l| l.starts_with(&format!("- {name}: ")))
            .unwrap_or_else(|| panic!("no probe set {name} in\n{summary}"));
        let num = |after: &str| -> usize {
            let rest = line.split(after).nth(1).unwrap_or("");
            let word = rest.split([' ', '(']).find(|w| !w.is_empty()).unwrap_or("");
            word.parse().unwrap_or_else(|_| panic!("{after} in {line}"))
        };
        (num(": "), num("reads of expert slices ("))
    };
    let (routed_reads, routed_pairs) = set("routed");
    assert!(routed_pairs > 0 && routed_pairs < pairs, "{summary}");
    let (half_reads, _) = set("cache 50% learned");
    assert!(half_reads < routed_reads, "{summary}");
    assert!(summary.contains("the workload routes to"), "{summary}");
    assert!(out.join("runs/workload-trace.trace").exists());
    let serial = row(&summary, "serial (baseline)");
    // | name | runs | tok/s | CI | per run | x baseline | ... | read bound |
    // compute bound | overlap bound | of bound | prefill s | prefill x baseline |
    // prefill reads x distinct | text |
    assert_eq!(serial[2], "2", "baseline ran twice: {serial:?}");
    assert_eq!(serial[6], "1.00x");
    assert_eq!(*serial.iter().rev().nth(1).unwrap(), "yes", "{serial:?}");
    let tok_s: f64 = serial[3].parse().unwrap();
    let bound: f64 = serial[serial.len() - 7].parse().unwrap();
    assert!(tok_s > 0.0 && bound > 0.0, "{serial:?}");
    // The overlap bound is the slower of the read and compute bounds (means
    // over the runs: at most the smaller mean); a cell that reads nothing
    // counted has no read bound.
    let read: f64 = serial[serial.len() - 9].parse().unwrap();
    let compute: f64 = serial[serial.len() - 8].parse().unwrap();
    assert!(bound <= read.min(compute) + 0.01, "{serial:?}");
    let res = row(&summary, "res");
    assert_eq!(res[res.len() - 9], "—", "{res:?}");
    assert_eq!(res[res.len() - 7], res[res.len() - 8], "{res:?}");
    let prefill_s: f64 = serial[serial.len() - 5].parse().unwrap();
    assert!(prefill_s > 0.0, "{serial:?}");
    assert_eq!(serial[serial.len() - 4], "1.00x", "{serial:?}");
    // Lossless cells produce the baseline's text.
    for cell in ["half", "res"] {
        let r = row(&summary, cell);
        assert_eq!(r[r.len() - 2], "yes", "{cell}: {r:?}");
    }
    // The cache cuts bytes per token; the resident (mmap) cell's reads are
    // page faults, not counted bytes: shown as "—".
    let mib = |r: &[&str]| r[8].parse::<f64>().unwrap();
    assert!(mib(&row(&summary, "half")) < mib(&serial), "{summary}");
    assert_eq!(row(&summary, "res")[8], "—");
    // The memory check covers the streamed cells.
    assert!(summary.contains("| serial | stream | 0 |"), "{summary}");
    assert!(!summary.contains("| NO |"), "RSS over budget:\n{summary}");
    // stdout carries the same cells table.
    assert!(stdout(&o).contains("| half |"));
    // What a user sees: the end-to-end rate of every run, below the
    // decodes-alone rate of the cells table, paired to the baseline.
    let e2e = &summary[summary.find("## End-to-end rate").expect("section")..];
    let e2e_row = |cell: &str| -> Vec<String> {
        let line = e2e.lines().find(|l| l.starts_with(&format!("| {cell} ")));
        let line = line.unwrap_or_else(|| panic!("no {cell} in\n{e2e}"));
        line.split('|').map(|c| c.trim().to_string()).collect()
    };
    let base = e2e_row("serial (baseline)");
    assert_eq!(base[2], "2", "{base:?}");
    // Run by run (round order in both tables), at most the decodes-alone
    // rate (to the tables' rounding) and not far below it.
    let rates = |s: &str| -> Vec<f64> { s.split(" / ").map(|x| x.parse().unwrap()).collect() };
    let (e2e_runs, alone_runs) = (rates(&base[4]), rates(serial[5]));
    assert_eq!(e2e_runs.len(), 2, "{base:?}");
    for (e, a) in e2e_runs.iter().zip(&alone_runs) {
        assert!(*e <= a + 0.01 && *e > 0.5 * a, "{base:?} vs {serial:?}");
    }
    assert!(base[5].ends_with('%'), "{base:?}");
    let res = e2e_row("res");
    assert!(res[6].ends_with("x (1)"), "paired over one round: {res:?}");
}

#[test]
fn bench_refuses_bad_plans_before_running_anything() {
    let dir = tempfile::tempdir().unwrap();
    let m = e8k2().to_str().unwrap().to_string();
    let out = dir.path().join("out");
    let cells = dir.path().join("cells.txt");
    let cases: [(&str, &str); 4] = [
        (
            "a: --cache-mb 0\nb: --overlap --no-such-flag\n",
            "--no-such-flag",
        ),
        ("a: --cache-mb 0\na: --overlap\n", "twice"),
        ("a: --csv x.csv\n", "set by the bench"),
        ("a: --resident --overlap\n", "cannot be used with"),
    ];
    for (text, want) in cases {
        std::fs::write(&cells, text).unwrap();
        let o = bmoe(&[
            "bench",
            "-m",
            &m,
            "--cells",
            cells.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{text}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{text}: {}", stderr(&o));
        assert!(!out.exists(), "nothing may run for a bad plan");
    }
    let o = bmoe(&[
        "bench",
        "-m",
        &m,
        "--preset",
        "nope",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("small-host"), "{}", stderr(&o));
    let o = bmoe(&[
        "bench",
        "-m",
        &m,
        "-w",
        "no-such-workload",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("prose, copy, long"), "{}", stderr(&o));
}

/// MemAvailable now, in MiB.
pub(crate) fn available_mib() -> i64 {
    (bmoe::stream::memory::mem_available_bytes().unwrap() / (1024 * 1024)) as i64
}

/// A `KEY: N kB` line of a `/proc` status file, in MiB.
pub(crate) fn kb_line_mib(file: &str, key: &str) -> i64 {
    let text = read(std::path::Path::new(file));
    let line = text.lines().find(|l| l.starts_with(key)).unwrap();
    let kb: i64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb / 1024
}

/// The host's anonymous memory and this process's, in MiB.
pub(crate) fn anon_mib() -> (i64, i64) {
    (
        kb_line_mib("/proc/meminfo", "AnonPages:"),
        kb_line_mib("/proc/self/status", "RssAnon:"),
    )
}

/// This process's `oom_score_adj`.
pub(crate) fn oom_score_adj() -> String {
    read(std::path::Path::new("/proc/self/oom_score_adj"))
        .trim()
        .to_string()
}

#[test]
fn balloon_holds_its_memory_and_a_ram_limited_bench_cleans_it_up() {
    use bmoe::lab::bench::balloon::Balloon;
    // The balloon on its own, in this process: every page touched and held
    // (the host's anonymous memory and this process's grow by the held
    // amount), first in the OOM killer's line while held, all given back on
    // drop. (MemAvailable lags on this kernel: freed pages sit on per-CPU
    // lists outside MemFree for a while, so the anonymous counts are read.)
    // The host's count moves with other processes too: a few tries.
    let held: i64 = 512;
    let adj = oom_score_adj();
    let near = |grew: i64| grew > held * 9 / 10 && grew < held * 11 / 10;
    // (host, own) before, while held and after: up by about `held`, then down.
    type Anon = (i64, i64);
    let fits = |&(b, d, a): &(Anon, Anon, Anon)| {
        near(d.0 - b.0) && near(d.0 - a.0) && near(d.1 - b.1) && near(d.1 - a.1)
    };
    let mut seen = Vec::new();
    for _ in 0..3 {
        let before = anon_mib();
        let b = Balloon::inflate(held as u64).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.mib, held as u64);
        assert_eq!(
            b.resident_bytes(),
            Some(held as u64 * 1024 * 1024),
            "every page touched"
        );
        assert!(b.still_held());
        assert_eq!(oom_score_adj(), "1000");
        let during = anon_mib();
        drop(b);
        assert_eq!(oom_score_adj(), adj, "the old bias is back");
        let after = anon_mib();
        seen.push((before, during, after));
        if seen.last().is_some_and(fits) {
            break;
        }
    }
    assert!(
        seen.last().is_some_and(fits),
        "(host AnonPages, own RssAnon) in MiB before, while held, after: {seen:?}"
    );

    // A bench asking for ~512 MiB less than is available inflates a small
    // balloon, reports it, and lets it go before it ends.
    let avail_mib = available_mib();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let limit = (avail_mib - 512).to_string();
    let o = bench_e8k2(
        dir.path(),
        "c0: --cache-mb 0\n",
        &["-n", "4", "--probe-depths", "1", "--ram-limit-mb", &limit],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let summary = read(&out.join("summary.md"));
    let line = summary
        .lines()
        .find(|l| l.starts_with("- balloon:"))
        .unwrap();
    assert!(line.contains("MiB held (oom_score_adj 1000"), "{line}");
    assert!(!summary.contains("WARNING: the balloon"), "{summary}");
    assert!(err.contains("balloon: holding "), "{err}");
    // Deflated after the matrix, before the summary and the bench's exit.
    let deflated = err
        .find("bench: balloon deflated")
        .unwrap_or_else(|| panic!("{err}"));
    assert!(err.rfind("bench: [").unwrap() < deflated, "{err}");
}

/// The summary's runs-table rows, in the order the runs ran, split into cells.
pub(crate) fn run_rows(summary: &str) -> Vec<Vec<&str>> {
    let start = summary.find("## Runs, in the order they ran").unwrap();
    summary[start..]
        .lines()
        .filter(|l| l.starts_with("| ") && l.as_bytes().get(2).is_some_and(u8::is_ascii_digit))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect()
}

#[test]
fn runs_beside_a_busy_neighbour_are_flagged_and_left_out_of_the_clean_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // Runs 2 (cell `b`, round 1) and 3 (the baseline, round 2) get a neighbour
    // keeping a core busy (a thread of the bench, counted as another's CPU).
    let o = bench_e8k2(
        dir.path(),
        "a: --cache-mb 0\nb: --cache-mb 50%\n",
        &["-n", "8", "-r", "3", "--busy-neighbour", "2,3"],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.matches("[busy neighbour]").count(), 2, "{err}");
    let summary = read(&out.join("summary.md"));
    let rows = run_rows(&summary);
    assert_eq!(
        rows.len(),
        7,
        "3 rounds of 2 and the baseline again:\n{summary}"
    );
    // | # | cell | round | tok/s | MiB/token | other CPU | steal | busy % | ms/read |
    // other reads | MemAvailable | page cache | CPU kernel ms | fresh page us | sys CPU s |
    // minor faults | wall s | csv | status | flags |
    for k in [2usize, 3] {
        let r = &rows[k - 1];
        let other: f64 = r[6].parse().unwrap();
        assert!(other > 0.5, "run {k}: other CPU {other}:\n{summary}");
        assert!(
            r[20].contains("other processes"),
            "run {k} not flagged:\n{summary}"
        );
    }
    // Every run's own kernel time and faults are counted (loading a model
    // alone faults in thousands of pages), and fresh memory was timed.
    for r in &rows {
        let fresh: f64 = r[14].parse().unwrap();
        let sys: f64 = r[15].parse().unwrap();
        let faults: u64 = r[16].parse().unwrap();
        assert!(
            fresh > 0.0 && sys > 0.0 && faults > 1000,
            "{r:?}\n{summary}"
        );
    }
    // Rounds 1 and 2 each had a flagged run: b's clean ratio has round 3 at most.
    let ratios = &summary[summary.find("## Ratios over all runs").unwrap()..];
    let ratio = ratios
        .lines()
        .find(|l| l.starts_with("| b | "))
        .unwrap()
        .split('|')
        .map(str::trim)
        .collect::<Vec<_>>();
    // | cell | flagged runs | all (rounds) | CI | unflagged (rounds) | CI | ...
    // Other tests running beside this one may flag more runs than the neighbour's.
    assert!(!ratio[2].starts_with("0 of"), "{ratio:?}");
    assert!(ratio[3].ends_with("(3)"), "{ratio:?}");
    assert!(ratio[5] == "—" || ratio[5].ends_with("(1)"), "{ratio:?}");
    assert!(summary.contains("A run is flagged when"), "{summary}");
}

#[test]
fn until_stable_adds_rounds_up_to_its_limit_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // No two runs agree to a millionth: the limit is reached and named.
    let o = bench_e8k2(
        dir.path(),
        "a: --cache-mb 0\nb: --cache-mb 50%\n",
        &[
            "-n",
            "4",
            "--until-stable",
            "0.000001",
            "--max-repeats",
            "3",
        ],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let summary = read(&out.join("summary.md"));
    assert_eq!(
        run_rows(&summary).len(),
        7,
        "3 rounds and the baseline:\n{summary}"
    );
    let note = summary
        .lines()
        .find(|l| l.starts_with("- --until-stable:"))
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(
        note.contains("LIMIT HIT: 3 rounds") && note.contains("b ("),
        "{note}"
    );
    // A width nothing misses stops at two rounds, the least that has an interval.
    let dir2 = tempfile::tempdir().unwrap();
    let o = bench_e8k2(
        dir2.path(),
        "a: --cache-mb 0\nb: --cache-mb 50%\n",
        // Any interval at all: stops at two rounds, whatever the host did.
        &["-n", "4", "--until-stable", "1e300"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let summary = read(&dir2.path().join("out/summary.md"));
    assert_eq!(run_rows(&summary).len(), 5, "{summary}");
    assert!(summary.contains("(relative) after 2 rounds"), "{summary}");
}
