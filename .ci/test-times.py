#!/usr/bin/env python3
"""Pass `cargo test` output through and print each test's time at the end.

libtest prints `test NAME ... ok` when a test ends. With one test thread
(RUST_TEST_THREADS=1, as .ci/run sets it) a test's time is the time
since the line before it, so the slowest tests can be read off a CI log
without a nightly-only flag. Reads stdin, echoes every line, and after the
last one prints the slowest tests and the time of each test binary.

Usage: cargo test --workspace 2>&1 | python3 .ci/test-times.py [--top N]
"""

import re
import sys
import time

RESULT = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)")
BINARY = re.compile(r"^\s*Running (?:unittests )?(\S+)(?: \((\S+)\))?")


def main() -> None:
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    times: list[tuple[float, str, str]] = []
    binaries: list[tuple[str, float]] = []
    binary, last = "", time.monotonic()
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        now = time.monotonic()
        m = BINARY.match(line)
        if m:
            binary = name_of(m.group(2) or m.group(1))
            binaries.append((binary, now))
            last = now
            continue
        m = RESULT.match(line)
        if m:
            times.append((now - last, binary, m.group(1)))
            last = now
    end = time.monotonic()
    report(times, binaries, end, top)


def name_of(path: str) -> str:
    """`target/debug/deps/integration-1a2b` -> `integration`."""
    base = path.rsplit("/", 1)[-1]
    return re.sub(r"-[0-9a-f]{16}$", "", base)


def report(times, binaries, end, top) -> None:
    print(f"\n== slowest {min(top, len(times))} of {len(times)} tests (seconds)")
    for secs, binary, name in sorted(times, reverse=True)[:top]:
        print(f"{secs:8.1f}  {binary}  {name}")
    print("\n== test binaries (seconds, including their start)")
    for i, (binary, start) in enumerate(binaries):
        stop = binaries[i + 1][1] if i + 1 < len(binaries) else end
        print(f"{stop - start:8.1f}  {binary}")


if __name__ == "__main__":
    main()
