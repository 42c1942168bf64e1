#!/usr/bin/env python3
"""Prints, last, which tests failed and why, from nextest's JUnit report.

A failing end-to-end test prints the logs of every process it started
(servers, agents, etcd members), often thousands of lines; a CI log is
often read from its tail only. scripts/test.sh calls this after every
`cargo nextest run`, so the tail names each failed test and its panic,
and each test that failed once and passed on its retry (.config/nextest.toml
lets the failover tests retry once): flaky is reported, never hidden.
Prints nothing when every test passed at its first attempt.

Usage: test-failures.py JUNIT.xml
"""
import sys
import xml.etree.ElementTree as ET

MAX_LINES = 12


def panic_lines(text):
    """The panic message in a test's stderr: from `panicked at` to the
    next blank line or backtrace, at most MAX_LINES lines."""
    lines = (text or "").splitlines()
    for i, line in enumerate(lines):
        if "panicked at" in line:
            out = []
            for l in lines[i:]:
                if (not l.strip() and out) or l.startswith(("stack backtrace:", "note: run with")):
                    break
                out.append(l)
                if len(out) == MAX_LINES:
                    break
            return out
    return []


def main(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"test-failures: cannot read the JUnit report {path}: {e}", file=sys.stderr)
        return 1
    failed, flaky = [], []
    for case in root.iter("testcase"):
        for tag in ("failure", "error"):
            failed += [(case, f) for f in case.findall(tag)]
        for tag in ("flakyFailure", "flakyError"):
            flaky += [(case, f) for f in case.findall(tag)]
    if flaky:
        print()
        print(f"==== {len(flaky)} attempt(s) failed, then passed on retry: flaky (from {path}) ====")
        report(flaky, "FLAKY")
    if failed:
        print()
        print(f"==== {len(failed)} test(s) failed (from {path}) ====")
        report(failed, "FAILED")
    return 0


def report(entries, label):
    for case, f in entries:
        name = f"{case.get('classname', '')} {case.get('name', '')}".strip()
        print(f"{label} {name} ({case.get('time', '?')} s): {f.get('type', '')}")
        # A retried attempt's output is inside its own element.
        why = (
            panic_lines(f.findtext("system-err"))
            or panic_lines(f.findtext("system-out"))
            or panic_lines(case.findtext("system-err"))
            or panic_lines(case.findtext("system-out"))
        )
        if not why and f.get("message"):
            why = f.get("message").splitlines()[:MAX_LINES]
        for line in why:
            print(f"    {line}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: test-failures.py JUNIT.xml", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
