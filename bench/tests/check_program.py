#!/usr/bin/env python3
"""Checks one mtbench program from ctest (bench/programs/CMakeLists.txt):

  check_program.py run BINARY NAME -- ARGS...   runs it with ARGS: exit 0, exactly one RESULT line
                                                that parses, bench=NAME, every headline metric of
                                                the benchmark present, and every numeric ARG echoed
                                                back with the same value
  check_program.py badargs BINARY NAME          bad arguments: exit 2 and a one-line message
Uses only the standard library and mtbench's matplotlib-free modules."""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mtbench import benchmarks, resultline  # noqa: E402


def fail(msg):
    print(f"FAIL: {msg}")
    print("0 passed, 1 failed")
    sys.exit(1)


def check_run(binary, name, args):
    proc = subprocess.run([binary] + args, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        fail(f"{name} {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    try:
        result = resultline.find_one(proc.stdout)
    except resultline.ResultLineError as e:
        fail(f"{name}: {e}; stdout was: {proc.stdout!r}")
    if proc.stdout.count("\n") != 1:
        fail(f"{name}: expected only the RESULT line on stdout, got {proc.stdout!r}")
    if result["bench"] != name:
        fail(f"bench={result['bench']}, expected {name}")
    bench = benchmarks.BENCHMARKS[name]
    for metric in bench.metrics:
        v = metric.value({"result": result, "rusage": {}})
        if not isinstance(v, (int, float)):
            fail(f"{name}: metric {metric.key} missing or not numeric in {result}")
    for key in ("elapsed_s", "cpu_user_s", "peak_rss_kb"):
        if not isinstance(result.get(key), (int, float)) or result[key] < 0:
            fail(f"{name}: {key} missing or negative")
    if result["peak_rss_kb"] <= 0:
        fail(f"{name}: peak_rss_kb is {result['peak_rss_kb']}")
    # Arguments are echoed back: --max-size 70000 -> max_size=70000 (pairs set producers and consumers).
    it = iter(args)
    for opt in it:
        value = next(it)
        key = opt[2:].replace("-", "_")
        echoed = {"pairs": ("producers", "consumers")}.get(key, (key,))
        for k in echoed:
            if k in result and str(result[k]) != value:
                fail(f"{name}: {opt} {value} but the result says {k}={result[k]}")
    print(f"ok: {proc.stdout.strip()}")
    print("1 passed, 0 failed")


def check_badargs(binary, name):
    # The first numeric option listed by --help is exercised with malformed values.
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    if help_text.returncode != 0 or "usage:" not in help_text.stdout:
        fail(f"{name} --help: exit {help_text.returncode}, output {help_text.stdout[:200]!r}")
    m = re.search(r"^\s+--([a-z-]+) N\b", help_text.stdout, re.M)
    if not m:
        fail(f"{name} --help lists no numeric option")
    opt = "--" + m.group(1)
    cases = [[opt, "-5"], [opt, "12x"], [opt, ""], [opt], ["--no-such-option", "1"], ["stray"],
             [opt, "99999999999999999999999"]]
    passed = 0
    for args in cases:
        proc = subprocess.run([binary] + args, capture_output=True, text=True, timeout=60)
        lines = proc.stderr.strip().splitlines()
        if proc.returncode != 2:
            fail(f"{name} {args}: exit {proc.returncode}, expected 2 (stderr {proc.stderr!r})")
        if len(lines) != 1 or not lines[0].startswith(f"{name}: "):
            fail(f"{name} {args}: expected one line '{name}: ...' on stderr, got {proc.stderr!r}")
        if "RESULT" in proc.stdout:
            fail(f"{name} {args}: printed a result despite bad arguments")
        passed += 1
        print(f"ok: {args} -> {lines[0]}")
    print(f"{passed} passed, 0 failed")


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "run":
        args = sys.argv[4:]
        if args and args[0] == "--":
            args = args[1:]
        check_run(sys.argv[2], sys.argv[3], args)
    elif len(sys.argv) == 4 and sys.argv[1] == "badargs":
        check_badargs(sys.argv[2], sys.argv[3])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
