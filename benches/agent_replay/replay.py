#!/usr/bin/env python3
"""The agent replay bench (issue 67): the first requests Claude Code and Codex
sent (benches/agent_replay/record.py's OUT/recorded) made into sessions of
--turns turns, each turn appending the assistant's tool call and a tool
result of synthetic file contents or test logs (--min/--max tokens each,
deterministic from --seed), replayed against `bmoe serve`: Claude Code's on
/v1/messages, Codex's on /v1/responses, both streamed, in the shapes the CLIs
send (tool_use/tool_result blocks; function_call/function_call_output items).

Cells (--cells, rotated per round; each a fresh server and a fresh
--prompt-cache folder):
  alone-on, alone-off  each session alone (Claude Code's, then Codex's),
                       prompt cache on / off, --parallel 1
  restart-on           alone, cache on, the server restarted before turn
                       --restart-at (then --restart-pause seconds)
  p1-on, p1-off        the two sessions interleaved turn by turn, --parallel 1
  p2-on                the two at once, each in its own thread, --parallel 2
Per turn (OUT/turns.csv): prompt tokens, tokens restored (usage's cached
tokens), tokens prefilled, the turn's new tokens (its prompt less its
session's previous prompt), time to first token (the first streamed delta),
the expert MiB read during it (/metrics; at --parallel 2 both sessions'),
and the send / first-token times from the cell's start. The per-cell table
goes to stdout and OUT/summary.md.

Usage: benches/agent_replay/replay.py BIN MODEL REC OUT [--rounds 2] [--turns 22]
         [--cells ...] [--ctx 65536] [--tokens 8] [--serve-flag=--moe-stream ...]
REC: record.py's OUT. Run it under the shared CPU lock (flock /tmp/bmoe-cpu.lock ...).
"""
import argparse
import copy
import csv
import json
import os
import random
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bmoe_serve as serve  # noqa: E402
import summary  # noqa: E402

CELLS = ["alone-on", "alone-off", "restart-on", "p1-on", "p1-off", "p2-on"]
WORDS = ("cache request server token expert layer prefix batch state tool reply "
         "session stream decode prompt sequence budget slot flash read write").split()


def synthetic(seed, i, lo, hi):
    """Turn i's tool output: (kind, path, text) of about lo..hi tokens (about
    2.5 characters a token on SmolLM2's tokenizer), a source file or a test log, from the seed."""
    rng = random.Random(f"{seed}-{i}")
    chars, kind = int(rng.randint(lo, hi) * 2.5), "file" if i % 2 else "log"
    path = f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}_{i}.rs"
    lines = []
    while sum(len(x) + 1 for x in lines) < chars:
        a, b, c = rng.choice(WORDS), rng.choice(WORDS), rng.choice(WORDS)
        n = rng.randint(0, 9999)
        if kind == "file":
            lines.append(rng.choice([
                f"    let {a}_{b} = self.{c}.get({n}).unwrap_or_default();",
                f"fn {a}_{b}(&mut self, {c}: usize) -> Result<{b.title()}, Error> {{",
                f"    // The {a} of each {b}, kept until the {c} ends ({n}).",
                f"    if {a}.len() > {n} {{ return Err(Error::{c.title()}); }}",
                "}"]))
        else:
            lines.append(rng.choice([
                f"test {a}::{b}_{c}_{n} ... ok",
                f"test {a}::tests::{c}_{b} ... ok ({n % 97}.{n % 10}s)",
                f"   Compiling {a}-{b} v0.{n % 20}.{n % 7} (/work/{a})",
                f"warning: unused variable: `{b}_{n}` --> src/{a}.rs:{n % 400}:{n % 80}"]))
    if kind == "file":
        text = "\n".join(f"{k + 1:6}\t{x}" for k, x in enumerate(lines))
    else:
        text = "\n".join(lines) + f"\ntest result: ok. {len(lines)} passed; 0 failed"
    return kind, path, text


def claude_turn(base, i, args):
    """The /v1/messages body of turn i (1-based): the recorded request with
    i-1 tool exchanges appended."""
    body = copy.deepcopy(base)
    body.update(stream=True, max_tokens=args.tokens)
    for k in range(1, i):
        kind, path, text = synthetic(args.seed, k, args.min, args.max)
        call = {"type": "tool_use", "id": f"toolu_{k:04d}", "name": "Read" if kind == "file" else "Bash",
                "input": {"file_path": path} if kind == "file" else {"command": "cargo test"}}
        body["messages"] += [{"role": "assistant", "content": [call]},
                             {"role": "user", "content": [{"type": "tool_result",
                                                           "tool_use_id": call["id"], "content": text}]}]
    return body


def codex_turn(base, i, args):
    """The /v1/responses body of turn i: the recorded request with i-1
    function calls and their outputs appended."""
    body = copy.deepcopy(base)
    body.update(stream=True, max_output_tokens=args.tokens)
    for k in range(1, i):
        kind, path, text = synthetic(args.seed + 1, k, args.min, args.max)
        cmd = f"sed -n '1,400p' {path}" if kind == "file" else "cargo test"
        body["input"] += [{"type": "function_call", "call_id": f"call_{k:04d}", "name": "exec_command",
                           "arguments": json.dumps({"cmd": cmd})},
                          {"type": "function_call_output", "call_id": f"call_{k:04d}", "output": text}]
    return body


SESSIONS = {"claude": ("/v1/messages?beta=true", "v1_messages", claude_turn),
            "codex": ("/v1/responses", "v1_responses", codex_turn)}


def recorded(rec, route):
    """The biggest body recorded on route (the agent's turn, not a side request)."""
    d = os.path.join(rec, "recorded")
    found = [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(f"-{route}.json")]
    return json.load(open(max(found, key=os.path.getsize)))["body"]


def send(port, path, body):
    """Stream one turn: (ttft s, end s, prompt tokens, cached tokens)."""
    ttft, prompt, cached, t, ev = None, None, 0, 0.0, None
    for t, ev in serve.events(port, path, body):
        kind = ev.get("type", "")
        if ttft is None and kind.endswith("delta") and kind != "message_delta":
            ttft = t
        if kind == "message_start":
            prompt = ev["message"]["usage"]["input_tokens"]
        elif kind == "message_delta":
            cached = ev["usage"].get("cache_read_input_tokens", 0)
        elif kind in ("response.completed", "response.incomplete"):
            u = ev["response"]["usage"]
            prompt, cached = u["input_tokens"], u["input_tokens_details"]["cached_tokens"]
    if prompt is None:
        raise SystemExit(f"{path}: the stream ended without its usage (last event: {ev})")
    return (ttft if ttft is not None else t), t, prompt, cached


class Cell:
    """One cell's server (restartable) and its rows."""

    def __init__(self, name, args, rnd):
        self.name, self.args, self.rnd = name, args, rnd
        self.cache = os.path.join(args.out, f"cache-{rnd}-{name}")
        self.flags = ["-c", str(args.ctx), "-t", "2", "-n", str(args.tokens),
                      "--parallel", "2" if name.startswith("p2") else "1",
                      "--prompt-cache", self.cache if name.endswith("-on") else "off"] + args.serve_flag
        self.log = os.path.join(args.out, f"server-{rnd}-{name}.log")
        self.rows, self.last, self.lock = [], {}, threading.Lock()
        self.p, self.port = serve.start(args.binary, args.model, self.flags, self.log)
        self.t0 = time.time()

    def restart(self):
        serve.stop(self.p)
        self.p, self.port = serve.start(self.args.binary, self.args.model, self.flags, self.log)
        time.sleep(self.args.restart_pause)

    def turn(self, who, i, bases, restarted=False):
        path, _, build = SESSIONS[who]
        body = build(bases[who], i, self.args)
        flash0 = serve.counter(self.port, "bmoe_flash_read_bytes_total")
        sent = time.time() - self.t0
        ttft, end, prompt, cached = send(self.port, path, body)
        flash = serve.counter(self.port, "bmoe_flash_read_bytes_total") - flash0
        with self.lock:
            row = {"model": self.args.label, "round": self.rnd, "cell": self.name, "session": who,
                   "turn": i, "restarted": int(restarted), "prompt_tokens": prompt,
                   "cached_tokens": cached, "prefilled": prompt - cached,
                   "new_tokens": prompt - self.last.get(who, 0), "ttft_s": round(ttft, 3),
                   "total_s": round(end, 3), "expert_mib": round(flash / 2**20, 1),
                   "sent_s": round(sent, 3), "first_s": round(sent + ttft, 3)}
            self.last[who] = prompt
            self.rows.append(row)
            # Each row as it comes: a bench stopped early keeps what ran.
            path = os.path.join(self.args.out, "turns.csv")
            with open(path, "a", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(row))
                if f.tell() == 0:
                    w.writeheader()
                w.writerow(row)
        print(row, flush=True)

    def close(self):
        serve.stop(self.p)
        shutil.rmtree(self.cache, ignore_errors=True)
        return self.rows


def run_cell(name, args, rnd, bases):
    cell = Cell(name, args, rnd)
    try:
        plan(cell, name, args, bases)
    finally:
        rows = cell.close()
    return rows


def plan(cell, name, args, bases):
    """The cell's turns: at once (p2), interleaved (p1), or one session
    after the other (alone, restart)."""
    turns = range(1, args.turns + 1)
    if name.startswith("p2"):
        def session(k, who):
            time.sleep(k * args.p2_stagger)  # the second session starts later
            for i in turns:
                cell.turn(who, i, bases)
        threads = [threading.Thread(target=session, args=(k, w)) for k, w in enumerate(SESSIONS)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    elif name.startswith("p1"):
        for i in turns:
            for who in SESSIONS:
                cell.turn(who, i, bases)
    else:
        for who in SESSIONS:
            for i in turns:
                restart = name.startswith("restart") and i == args.restart_at
                if restart:
                    cell.restart()
                cell.turn(who, i, bases, restart)


def main():
    ap = argparse.ArgumentParser()
    for a in ("binary", "model", "rec", "out"):
        ap.add_argument(a)
    ap.add_argument("--label", default="", help="the model's name in the table (default: its file)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--first-round", type=int, default=0,
                    help="the first round's number (more rounds into the same OUT)")
    ap.add_argument("--turns", type=int, default=22)
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--ctx", type=int, default=65536)
    ap.add_argument("--tokens", type=int, default=8, help="max tokens of each reply")
    ap.add_argument("--min", type=int, default=500, help="a tool output's fewest tokens")
    ap.add_argument("--max", type=int, default=3000, help="a tool output's most tokens")
    ap.add_argument("--seed", type=int, default=67)
    ap.add_argument("--restart-at", type=int, default=10)
    ap.add_argument("--restart-pause", type=float, default=3.0)
    ap.add_argument("--p2-stagger", type=float, default=0.0,
                    help="p2 cells: the second session (Codex's) starts S seconds after the first")
    ap.add_argument("--serve-flag", action="append", default=[],
                    help="a flag for every server (repeat: --serve-flag=--moe-stream)")
    args = ap.parse_args()
    args.label = args.label or os.path.basename(args.model)
    os.makedirs(args.out, exist_ok=True)
    bases = {w: recorded(args.rec, SESSIONS[w][1]) for w in SESSIONS}
    cells, rows = args.cells.split(","), []
    for rnd in range(args.first_round, args.first_round + args.rounds):
        # The order rotates by round, so no cell always runs first.
        k = rnd % len(cells)
        for name in cells[k:] + cells[:k]:
            rows += run_cell(name, args, rnd, bases)
    table = summary.table(rows)
    print(table)
    with open(os.path.join(args.out, "summary.md"), "a") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
