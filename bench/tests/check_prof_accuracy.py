#!/usr/bin/env python3
"""Checks bench/programs/prof_accuracy.c from ctest: run under qmalloc with a small sampling interval
(64 KiB, 16 MiB per site: about 256 samples per keeping site, so these bounds are over 6 standard
deviations wide and cannot fail by chance), it must find the profiler, put live bytes at exactly the
four keeping sites and nowhere else, and estimate each within 40%; without qmalloc it must say
profiler=none and still exit 0. Not a measurement: the figures at the default rate are in
docs/profiling.md. usage: check_prof_accuracy.py PROGRAM LIBQMALLOC"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mtbench import resultline  # noqa: E402

program, lib = sys.argv[1], sys.argv[2]
failed = passed = 0


def check(ok, what):
    global failed, passed
    print(("PASS " if ok else "FAIL ") + what)
    passed += ok
    failed += not ok


# A small interval on a short run, so that a few hundred samples come quickly: the sample budget
# (QMALLOC_PROF_MAX_SAMPLES) would stretch these intervals and leave fewer; this checks what a
# count of samples gives, so the budget is off here (unit-prof checks the budget).
env = dict(os.environ, LD_PRELOAD=lib, QMALLOC_PROF_SAMPLE="64K", QMALLOC_PROF_MAX_SAMPLES="0")
proc = subprocess.run([program, "--megabytes", "16"], capture_output=True, text=True, env=env, timeout=300)
check(proc.returncode == 0, f"under qmalloc: exit {proc.returncode} {proc.stderr.strip()}")
r = resultline.find_one(proc.stdout) if proc.returncode == 0 else {}
check(r.get("profiler") == "qm_prof_dump" and r.get("rate") == 65536, f"profiler found, rate 64K: {proc.stdout.strip()}")
check(r.get("leak_sites_exact") == 1, "live bytes at exactly the keeping sites")
check(r.get("other_mb") == 0, "no live bytes outside the sites")
for site in ("keep_16", "keep_1k", "keep_32k", "keep_1m"):
    err = r.get(f"{site}_err_pct")
    check(isinstance(err, (int, float)) and err < 40, f"{site}: error {err}% < 40%")
for site in ("free_64", "free_4k", "free_256k"):
    check(r.get(f"{site}_mb") == 0, f"{site}: nothing live")

plain = subprocess.run([program, "--megabytes", "1"], capture_output=True, text=True, timeout=300)
check(plain.returncode == 0 and "profiler=none" in plain.stdout, f"without qmalloc: profiler=none ({plain.stdout.strip()})")
bad = subprocess.run([program, "--megabytes", "x"], capture_output=True, text=True, timeout=60)
check(bad.returncode == 2 and bad.stderr.count("\n") == 1, f"bad argument: exit {bad.returncode}, one line")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed or not passed else 0)
