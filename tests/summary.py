#!/usr/bin/env python3
"""One summary of a whole test run (tests/run.sh), from its captured logs.

    python3 tests/summary.py [--junit JUNIT_XML --junit-status N] \
        [--cargo CARGO_LOG --cargo-status N] [--pytest PYTEST_LOG --pytest-status N]

JUNIT_XML is cargo-nextest's JUnit report: each test case counts, named
`binary::test`, failed when it has a failure or error (a crash or timeout
included), skipped when marked so; its times give the ten slowest tests.
CARGO_LOG is the output (stdout and stderr) of `cargo test --workspace
--no-fail-fast`: every `test result:` line is counted, failed tests come from
libtest's `test NAME ... FAILED` lines and are named `binary::test`, and a
test binary that has a `Running` line but no result, and cargo's note that it
did not exit successfully (a crash, a signal, a timeout) or the log's end
after it, is listed as crashed. PYTEST_LOG is pytest's output: its closing
counts line and its `FAILED`/`ERROR` lines. A runner that exited non-zero
with no failure found in its log is listed too (a build error, a failed
setup step).

Prints the ten slowest tests (or test binaries, from a cargo log), the failures, and as the very last line
`summary: N passed, N failed, N skipped`. Exits 1 when anything failed.
Standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from xml.etree import ElementTree

# `     Running tests/admin.rs (target/debug/deps/admin-0123abcd)`
# `     Running unittests src/lib.rs (target/debug/deps/minions_worker-0123abcd)`
RUNNING = re.compile(r"^\s+Running (?:unittests )?(\S+) \((?:.*[/\\])?([^/\\()]+?)(?:-[0-9a-f]{8,})?(?:\.exe)?\)\s*$")
DOCTESTS = re.compile(r"^\s+Doc-tests (\S+)\s*$")
RESULT = re.compile(
    r"^test result: (?:ok|FAILED)\. (\d+) passed; (\d+) failed; (\d+) ignored;.*?(?:finished in ([\d.]+)s)?\s*$"
)
TEST_LINE = re.compile(r"^test (.+?) \.\.\. (ok|FAILED|ignored\b.*)$")
# cargo's note under a test binary that did not exit successfully.
NOT_SUCCESS = re.compile(r"process didn't exit successfully: .*\((.+)\)\s*$")
TARGETS_FAILED = re.compile(r"^error: (\d+) targets? failed:")
COULD_NOT_COMPILE = re.compile(r"^error: could not compile (.+)$")

PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)\b")
PYTEST_FINAL = re.compile(r"^=*\s*(?:(?:\d+ \w+(?:, )?)+|no tests ran)\s+in [\d.]+s(?: \([^)]*\))?\s*=*\s*$")
PYTEST_FAILED = re.compile(r"^(FAILED|ERROR) (\S+)")


class Totals:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.failures: list[str] = []
        self.notes: list[str] = []
        # (seconds, name) of test binaries (cargo log) and of tests (JUnit).
        self.times: list[tuple[float, str]] = []
        self.slow: list[tuple[float, str]] = []


class Binary:
    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.result: tuple[int, int, int] | None = None
        self.failed: list[str] = []
        self.ok = 0
        self.ignored = 0
        self.crash = ""


def read(path: str) -> list[str]:
    text = Path(path).read_text(errors="replace")
    # Strip ANSI colours, should a log have them.
    return re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()


def cargo(path: str, status: int, t: Totals) -> None:
    binaries: list[Binary] = []
    names: set[str] = set()
    current: Binary | None = None
    targets_failed: int | None = None
    for line in read(path):
        m = RUNNING.match(line)
        d = DOCTESTS.match(line)
        if m or d:
            if m:
                source, name = m.group(1), m.group(2)
            else:
                source, name = "doc-tests", f"{d.group(1)}(doc)"
            if name in names:
                name = f"{name}[{source}]"
            names.add(name)
            current = Binary(name, source)
            binaries.append(current)
            continue
        m = RESULT.match(line)
        if m and current is not None and current.result is None:
            current.result = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            if m.group(4):
                t.times.append((float(m.group(4)), current.name))
            continue
        m = TEST_LINE.match(line)
        if m and current is not None and current.result is None:
            if m.group(2) == "FAILED":
                current.failed.append(m.group(1))
            elif m.group(2) == "ok":
                current.ok += 1
            else:
                current.ignored += 1
            continue
        m = NOT_SUCCESS.search(line)
        if m and current is not None and current.result is None:
            current.crash = m.group(1)
            continue
        m = TARGETS_FAILED.match(line)
        if m:
            targets_failed = int(m.group(1))
            continue
        m = COULD_NOT_COMPILE.match(line)
        if m:
            t.failed += 1
            t.failures.append(f"build: could not compile {m.group(1)}")

    failing_binaries = 0
    for b in binaries:
        if b.result is not None:
            passed, failed, ignored = b.result
            t.passed += passed
            t.skipped += ignored
            t.failed += failed
            t.failures.extend(f"{b.name}::{n}" for n in b.failed)
            if failed > len(b.failed):
                t.failures.append(f"{b.name}: {failed - len(b.failed)} more failed, names not in the log")
            if failed:
                failing_binaries += 1
        elif not b.crash and b is not binaries[-1]:
            # No result line, yet cargo went on without a failure note: a
            # binary that exited 0 without libtest's output (harness = false).
            t.notes.append(f"{b.name}: exited successfully without a test result line ({b.source})")
        else:
            # No result line: the binary died (or the log ends in it). What it
            # finished before counts.
            t.passed += b.ok
            t.skipped += b.ignored
            t.failed += len(b.failed) + 1
            t.failures.extend(f"{b.name}::{n}" for n in b.failed)
            t.failures.append(f"{b.name}: crashed, no test result ({b.crash or 'no exit status in the log'}; {b.source})")
            failing_binaries += 1
    if targets_failed is not None and targets_failed != failing_binaries:
        t.notes.append(
            f"cargo reported {targets_failed} failed targets, the log shows {failing_binaries} failing binaries"
        )
    if status != 0 and failing_binaries == 0 and not any(f.startswith("build:") for f in t.failures):
        t.failed += 1
        t.failures.append(f"cargo test: exited {status} with no failed test in its log")
    if status == 0 and failing_binaries:
        t.notes.append("cargo test exited 0 although the log shows failures")


def junit(path: str, status: int, t: Totals) -> None:
    """Counts a nextest JUnit report: one <testcase> per test, a <failure>
    or <error> child when it failed (crashes and timeouts included), a
    <skipped> child when it was skipped; its `time` attribute is seconds."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as e:
        t.failed += 1
        t.failures.append(f"cargo nextest: no readable JUnit report ({e}); exited {status}")
        return
    failing = 0
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '?')}::{case.get('name', '?')}"
        if case.find("skipped") is not None:
            t.skipped += 1
            continue
        try:
            t.slow.append((float(case.get("time", "0")), name))
        except ValueError:
            pass
        if case.find("failure") is not None or case.find("error") is not None:
            t.failed += 1
            failing += 1
            t.failures.append(name)
        else:
            t.passed += 1
    if status != 0 and failing == 0:
        t.failed += 1
        t.failures.append(f"cargo nextest: exited {status} with no failed test in its report")


def pytest(path: str, status: int, t: Totals) -> None:
    lines = read(path)
    final = next((l for l in reversed(lines) if PYTEST_FINAL.match(l.strip())), None)
    failed_ids: list[str] = []
    for line in lines:
        m = PYTEST_FAILED.match(line)
        if m and m.group(2) not in failed_ids:
            failed_ids.append(m.group(2))
    if final is None:
        t.failed += 1
        t.failures.extend(failed_ids)
        t.failures.append(f"python tests: exited {status} with no pytest result line")
        return
    counts: dict[str, int] = {}
    for n, word in PYTEST_COUNTS.findall(final):
        counts[word.rstrip("s") if word.startswith("error") else word] = int(n)
    failed = counts.get("failed", 0) + counts.get("error", 0)
    t.passed += counts.get("passed", 0) + counts.get("xpassed", 0)
    t.skipped += counts.get("skipped", 0) + counts.get("xfailed", 0)
    t.failed += failed
    t.failures.extend(failed_ids)
    if failed > len(failed_ids):
        t.failures.append(f"python tests: {failed - len(failed_ids)} more failed, names not in the log")
    # pytest exits 5 when it collected no tests: a failure here.
    if status != 0 and failed == 0:
        t.failed += 1
        t.failures.append(f"python tests: pytest exited {status} ({final.strip(' =')})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--junit", help="JUnit report of cargo nextest run")
    ap.add_argument("--junit-status", type=int, default=0)
    ap.add_argument("--cargo", help="log of cargo test --workspace --no-fail-fast")
    ap.add_argument("--cargo-status", type=int, default=0)
    ap.add_argument("--pytest", help="log of tests/python/run.sh")
    ap.add_argument("--pytest-status", type=int, default=0)
    args = ap.parse_args()

    t = Totals()
    if args.junit:
        junit(args.junit, args.junit_status, t)
    if args.cargo:
        cargo(args.cargo, args.cargo_status, t)
    if args.pytest:
        pytest(args.pytest, args.pytest_status, t)

    print()
    print("=" * 30, "test summary", "=" * 30)
    if t.slow:
        print("slowest tests:")
        for secs, name in sorted(t.slow, reverse=True)[:10]:
            print(f"  {secs:8.2f}s  {name}")
    elif t.times:
        print("slowest test binaries:")
        for secs, name in sorted(t.times, reverse=True)[:10]:
            print(f"  {secs:8.2f}s  {name}")
    for note in t.notes:
        print(f"note: {note}")
    if t.failures:
        print("failed:")
        for f in t.failures:
            print(f"  {f}")
    line = f"summary: {t.passed} passed, {t.failed} failed"
    if t.skipped:
        line += f", {t.skipped} skipped"
    print(line)
    return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())
