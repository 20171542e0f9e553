#!/usr/bin/env python3
"""The agent replay's tables from its rows (replay.py, or OUT/turns.csv:
`summary.py OUT/turns.csv ...`).

Per model, cell and session, pooled over rounds: the turns, new and
prefilled tokens of the turns after the first, the worst excess of a turn
after the first over its new tokens (the issue's bound: 1%), the median time
to first token of the continuing turns (after the first, not the restart's),
the turn after the restart against the same turn continuing (alone-on, same
round), each turn's TTFT against the same turn alone (alone-on, same round),
and the expert MiB read. Then, at --parallel 2, how much of the other
session's prefill a turn waited for."""
import argparse
import csv
import statistics

med = statistics.median


def key(r):
    return (r["model"], int(r["round"]), r["session"], int(r["turn"]))


def cell_line(rows, alone):
    """One table line's cells for one (model, cell, session)'s rows."""
    later = [r for r in rows if int(r["turn"]) > 1]
    cont = [float(r["ttft_s"]) for r in later if not int(r["restarted"])]
    worst = max(later, key=lambda r: (int(r["prefilled"]) - int(r["new_tokens"])) / int(r["new_tokens"]))
    excess = (int(worst["prefilled"]) - int(worst["new_tokens"])) / int(worst["new_tokens"])
    ratios = [float(r["ttft_s"]) / float(alone[key(r)]["ttft_s"]) for r in later if key(r) in alone]
    rest = [r for r in rows if int(r["restarted"])]
    rest_s = ", ".join(f"{float(r['ttft_s']):.2f} ({float(r['ttft_s']) / float(alone[key(r)]['ttft_s']):.2f}x)"
                       if key(r) in alone else f"{float(r['ttft_s']):.2f}" for r in rest) or "-"
    return [len(rows), sum(int(r["new_tokens"]) for r in later), sum(int(r["prefilled"]) for r in later),
            f"{100 * excess:+.1f}% (turn {worst['turn']})", f"{med(cont):.2f}", rest_s,
            f"{med(ratios):.2f} / {max(ratios):.2f}" if ratios else "-",
            f"{sum(float(r['expert_mib']) for r in rows):.0f}",
            max(int(r["prompt_tokens"]) for r in rows)]


def waits(rows, alone):
    """At --parallel 2: per turn after the first whose wait for its first
    token overlapped the other session's (the other's send to first token),
    its excess over the same turn alone against that overlap."""
    p2 = [r for r in rows if r["cell"].startswith("p2") and int(r["turn"]) > 1 and key(r) in alone]
    out = []
    for r in p2:
        a, b = float(r["sent_s"]), float(r["first_s"])
        others = [o for o in rows if o["cell"] == r["cell"] and o["round"] == r["round"]
                  and o["model"] == r["model"] and o["session"] != r["session"]]
        overlap = sum(max(0.0, min(b, float(o["first_s"])) - max(a, float(o["sent_s"]))) for o in others)
        excess = float(r["ttft_s"]) - float(alone[key(r)]["ttft_s"])
        if overlap > 0.05:
            out.append((excess, overlap, r))
    return out


def table(rows):
    rows = [{k: str(v) for k, v in r.items()} for r in rows]
    alone = {key(r): r for r in rows if r["cell"] == "alone-on"}
    head = ("| model | cell | session | turns | new tokens (turns 2+) | prefilled (turns 2+) | worst excess "
            "over new | TTFT s, continuing (median) | turn after restart: TTFT s (vs the same turn in alone-on) | "
            "TTFT vs alone (median / worst) | expert MiB | largest prompt |")
    lines = [head, "|---|---|---|" + "---:|" * 9]
    groups = sorted({(r["model"], r["cell"], r["session"]) for r in rows})
    for m, c, s in groups:
        g = [r for r in rows if (r["model"], r["cell"], r["session"]) == (m, c, s)]
        lines.append("| " + " | ".join(map(str, [m, c, s] + cell_line(g, alone))) + " |")
    w = waits(rows, alone)
    if w:
        lines += ["", "| model | turns at --parallel 2 overlapping the other's prefill | their wait over the "
                  "same turn alone, s (median) | the overlap, s (median) | excess / overlap (median, max) |",
                  "|---|---:|---:|---:|---:|"]
        for m in sorted({x[2]["model"] for x in w}):
            mw = [x for x in w if x[2]["model"] == m]
            ratio = [e / o for e, o, _ in mw]
            lines.append(f"| {m} | {len(mw)} | {med([e for e, _, _ in mw]):.2f} | "
                         f"{med([o for _, o, _ in mw]):.2f} | {med(ratio):.2f}, {max(ratio):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+")
    a = ap.parse_args()
    print(table([r for f in a.csv for r in csv.DictReader(open(f))]))
