#!/usr/bin/env python3
"""One cell against another of the same `bmoe bench` run, paired by round.

`bmoe bench` reports every cell against the baseline (the first cell). To
judge a cell against another one (a gated cell against the off cell of the
same mode), this reads the "Cells" table of summary.md, pairs the two cells'
runs by round (the per-run column lists them in round order; the baseline's
extra run, its last, is left out) and prints the geometric mean of the
per-round ratios with a Student's t 95% interval on their logs.

With --end-to-end it pairs the runs' end-to-end rates (the "End-to-end
rate" table: decode_tok_s, drafting and the loop between decodes included,
what a user sees) instead of the cells table's decodes-alone tok/s; compare
speculating cells that way.

Usage: benches/cell_pairs.py [--end-to-end] SUMMARY.md NUMERATOR:DENOMINATOR [...]
e.g.   benches/cell_pairs.py --end-to-end DIR/summary.md gate-res:off-res gate-c25:off-c25
"""
import math
import sys

# Two-sided 95% Student's t quantiles by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365,
       8: 2.306, 9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 15: 2.131, 20: 2.086}


def per_run(path, section):
    text = open(path, encoding="utf-8").read()
    if section not in text:
        sys.exit(f"no '{section}' table in {path} (a bench from before it was added?)")
    start = text.index(section)
    runs = {}
    header = None
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None and cells and cells[0] == "cell":
            header = cells
            continue
        if header is None or len(cells) != len(header) or cells[0].startswith("---"):
            continue
        name = cells[0].split(" ")[0]
        values = [float(x) for x in cells[header.index("per run")].split("/")]
        runs[name] = values
    return runs


def t95(df):
    keys = sorted(k for k in T95 if k <= df)
    return T95[keys[-1]] if keys else float("nan")


def pair(runs, num, den):
    n = min(len(runs[num]), len(runs[den]))
    logs = [math.log(a / b) for a, b in zip(runs[num][:n], runs[den][:n])]
    mean = sum(logs) / n
    if n < 2:
        return math.exp(mean), None, n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t95(n - 1) * sd / math.sqrt(n)
    return math.exp(mean), (math.exp(mean - half), math.exp(mean + half)), n


def main():
    args = sys.argv[1:]
    end_to_end = "--end-to-end" in args
    args = [a for a in args if a != "--end-to-end"]
    if len(args) < 2:
        sys.exit(__doc__)
    runs = per_run(args[0], "## End-to-end rate" if end_to_end else "## Cells")
    print("| cell / against | rounds | paired ratio | 95% CI |")
    print("|---|---:|---:|---|")
    for spec in args[1:]:
        num, den = spec.split(":")
        missing = [c for c in (num, den) if c not in runs]
        if missing:
            sys.exit(f"no cell {', '.join(missing)} in {args[0]} (cells: {', '.join(runs)})")
        ratio, ci, n = pair(runs, num, den)
        ci_text = "—" if ci is None else f"{ci[0]:.3f}–{ci[1]:.3f}"
        print(f"| {num} / {den} | {n} | {ratio:.3f}x | {ci_text} |")


if __name__ == "__main__":
    main()
