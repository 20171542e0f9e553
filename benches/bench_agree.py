#!/usr/bin/env python3
"""Do two `bmoe bench` runs of the same matrix agree?

Reads the "Ratios over all runs and over the unflagged ones" table of two
summary.md files and prints, per cell, both runs' paired ratio to the baseline
and fraction of bound, over all runs and over the unflagged ones, and whether
they agree: the ratios within WIDTH of each other (relative to the first run's
ratio; give the --until-stable width) and the fractions of bound within POINTS
percentage points. Exit status 0 when every cell agrees over the unflagged runs.
For a cell that does not agree, the last column says what the two benches'
recorded conditions show for it and for the baseline (the ratio's other side):
the medians of the runs table's device ms/read (more than 1.5x apart, the
bench's own device threshold), CPU kernel ms (1.10x), other CPU cores (0.25
apart), fresh page us (1.5x: how fast the host backed the guest's new
memory) and the run's own kernel CPU seconds (sys CPU s, 1.5x: the same run
faulting in the same fresh pages at another cost); summaries older than a
column have none of it;
"none recorded" when none of them moved. A fraction of bound that
disagrees where either bench had runs above their bound (the summary's "N of M
above the probe", or a mean over 100% in older summaries) is put down to that:
the probe measured less than the cell did, so it is no ceiling for that cell.
A cell whose runs, or whose baseline's runs, either bench flagged has those
flags' kinds named too (the summary's runs table says why each was flagged);
they count as the reason for a ratio only when the ratios over the unflagged
runs agree. The last line counts the cells that agree over all runs, and of
the rest how many have a recorded reason and which have none.

Usage: benches/bench_agree.py A/summary.md B/summary.md [--width 0.25] [--points 10]
"""
import argparse
import re
import sys


def ratios(path):
    text = open(path, encoding="utf-8").read()
    start = text.index("## Ratios over all runs")
    rows = {}
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or cells[0] in ("cell", "") or cells[0].startswith("---"):
            continue
        rows[cells[0]] = {
            "flagged": cells[1],
            "all": number(cells[2]),
            "clean": number(cells[4]),
            "bound_all": number(cells[6]),
            "bound_clean": number(cells[7]),
            "bound_text": cells[6],
        }
    return rows


RUN_COLUMNS = {"device": "device ms/read", "other_cpu": "other CPU cores",
               "kernel": "CPU kernel ms", "fresh": "fresh page us", "sys": "sys CPU s",
               "faults": "minor faults"}


def runs(path):
    """Per cell, the runs table's values: {cell: {column: [values]}}."""
    text = open(path, encoding="utf-8").read()
    start = text.index("## Runs, in the order they ran")
    out, at = {}, {}
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:2] == ["#", "cell"]:
            at = {k: cells.index(h) for k, h in RUN_COLUMNS.items() if h in cells}
            continue
        if len(cells) < 13 or not cells[0].isdigit():
            continue
        row = out.setdefault(cells[1], {k: [] for k in RUN_COLUMNS} | {"flags": []})
        if cells[-1] not in ("—", ""):
            row["flags"].append(cells[-1])
        for key, i in at.items():
            v = number(cells[i])
            if v is not None:
                row[key].append(v)
    return out


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None


def moved(name, a, b):
    """What moved between bench A's and bench B's runs of one cell."""
    why = []
    tests = (
        ("device", "device {:.2} / {:.2} ms/read", lambda x, y: max(x, y) / min(x, y) > 1.5),
        ("kernel", "CPU kernel {:.2} / {:.2} ms", lambda x, y: max(x, y) / min(x, y) > 1.10),
        ("other_cpu", "other CPU {:.2} / {:.2} cores", lambda x, y: abs(x - y) > 0.25),
        ("fresh", "fresh memory {:.2} / {:.2} us/page", lambda x, y: max(x, y) / min(x, y) > 1.5),
        ("sys", "sys CPU {:.2} / {:.2} s per run", lambda x, y: max(x, y) / min(x, y) > 1.5),
    )
    for key, text, off in tests:
        x, y = median(a.get(key, [])), median(b.get(key, []))
        if x and y and off(x, y):
            why.append(f"{name}: " + text.format(x, y))
            if key == "sys" and a.get("faults") and b.get("faults"):
                why[-1] += " (minor faults {:.0f} / {:.0f})".format(
                    median(a["faults"]), median(b["faults"]))
    return why


def above_probe(row):
    """Whether a cell's fraction of bound says runs beat their bound."""
    return "above the probe" in row["bound_text"] or (row["bound_all"] or 0) > 100


def bound_reason(a, b):
    """Why two fractions of bound may differ: runs above their bound."""
    if not (above_probe(a) or above_probe(b)):
        return None
    return (f"of bound {a['bound_text']} / {b['bound_text']}: runs above their bound, "
            "so the probe is no ceiling for this cell")


def flag_kinds(runs_of_cell):
    """The kinds of flag a cell's runs got ("steal", "fresh memory", ...) and how many runs."""
    def kind(flag):
        m = re.match(r"([A-Za-z][A-Za-z ]*?)\s*[0-9(]", flag)
        return m.group(1) if m else flag

    flags = runs_of_cell.get("flags", [])
    return len(flags), sorted({kind(f.strip()) for run in flags for f in run.split(";")})


def flagged_reason(label, a, b):
    """Which of bench A's and B's runs of a cell were flagged, and for what."""
    parts = []
    for bench, runs_of_cell in (("A", a), ("B", b)):
        n, kinds = flag_kinds(runs_of_cell)
        if n:
            parts.append(f"{bench} {n} run(s) ({', '.join(kinds)})")
    return f"{label} flagged: " + ", ".join(parts) if parts else None


def number(cell):
    if cell.startswith("1 (baseline)"):
        return 1.0
    m = re.match(r"([0-9.]+)", cell)
    return float(m.group(1)) if m else None


def agree(a, b, width, points, ratio_key, bound_key):
    ra, rb = a[ratio_key], b[ratio_key]
    ba, bb = a[bound_key], b[bound_key]
    ok_ratio = ra is not None and rb is not None and abs(ra - rb) <= width * ra
    ok_bound = ba is not None and bb is not None and abs(ba - bb) <= points
    return ok_ratio, ok_bound


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--points", type=float, default=10.0)
    args = p.parse_args()
    a, b = ratios(args.a), ratios(args.b)
    runs_a, runs_b = runs(args.a), runs(args.b)
    baseline = next(iter(a), None)
    fmt = lambda v, suffix: "—" if v is None else f"{v:.3f}{suffix}" if suffix == "x" else f"{v:.0f}{suffix}"
    print("| cell | flagged A / B | x baseline A / B (all) | (unflagged) | of bound A / B (all) | (unflagged) | agree (all) | agree (unflagged) | what moved (medians A / B) |")
    print("|---|---|---|---|---|---|---|---|---|")
    all_clean = True
    agreeing, explained, unexplained = [], [], []
    for cell in a:
        if cell not in b:
            continue
        x, y = a[cell], b[cell]
        verdicts = []
        for rk, bk in (("all", "bound_all"), ("clean", "bound_clean")):
            r, bd = agree(x, y, args.width, args.points, rk, bk)
            verdicts.append("yes" if r and bd else f"ratio {'ok' if r else 'NO'}, bound {'ok' if bd else 'NO'}")
        all_clean &= verdicts[1] == "yes"
        why = "—"
        if verdicts[0] != "yes":
            found = []
            ok_ratio, ok_bound = agree(x, y, args.width, args.points, "all", "bound_all")
            ok_clean_ratio = agree(x, y, args.width, args.points, "clean", "bound_clean")[0]
            reason = None if ok_bound else bound_reason(x, y)
            if reason:
                found.append(reason)
            conditions = []
            if not ok_ratio or not reason:
                conditions = moved(cell, runs_a.get(cell, {}), runs_b.get(cell, {}))
                if cell != baseline:
                    conditions += moved("baseline", runs_a.get(baseline, {}), runs_b.get(baseline, {}))
            found += conditions
            flagged = []
            if not ok_ratio:
                pairs = [(cell, cell)] + ([("baseline", baseline)] if cell != baseline else [])
                for label, name in pairs:
                    f = flagged_reason(label, runs_a.get(name, {}), runs_b.get(name, {}))
                    if f:
                        flagged.append(f)
                if flagged and ok_clean_ratio:
                    flagged.append("the unflagged runs' ratios agree")
            found += flagged
            why = "; ".join(found) or "none recorded"
            bound_known = ok_bound or reason or conditions
            ratio_known = ok_ratio or conditions or (flagged and ok_clean_ratio)
            (explained if bound_known and ratio_known else unexplained).append(cell)
        else:
            agreeing.append(cell)
        print(
            f"| {cell} | {x['flagged']} / {y['flagged']} "
            f"| {fmt(x['all'], 'x')} / {fmt(y['all'], 'x')} | {fmt(x['clean'], 'x')} / {fmt(y['clean'], 'x')} "
            f"| {fmt(x['bound_all'], '%')} / {fmt(y['bound_all'], '%')} | {fmt(x['bound_clean'], '%')} / {fmt(y['bound_clean'], '%')} "
            f"| {verdicts[0]} | {verdicts[1]} | {why} |"
        )
    total = len(agreeing) + len(explained) + len(unexplained)
    print(f"\nOver all runs {len(agreeing)} of {total} cells agree; of the rest "
          f"{len(explained)} have a recorded reason and {len(unexplained)} do not"
          + (f" ({', '.join(unexplained)})." if unexplained else "."))
    sys.exit(0 if all_clean else 1)


if __name__ == "__main__":
    main()
