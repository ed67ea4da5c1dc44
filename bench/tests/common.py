"""Shared helpers of mtbench's tests: where the repository, the build and the fixture are, and
how to run the driver as a user would (a child process, `python -m mtbench`)."""

import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(TESTS)
REPO = os.path.dirname(BENCH)
BUILD = os.path.abspath(os.environ.get("MTBENCH_BUILD_DIR") or os.path.join(REPO, "build"))
FIXTURE = os.path.join(TESTS, "fixture")
CRASH_ALLOC = os.path.join(BUILD, "bench", "libmtbench_crash_alloc.so")

if BENCH not in sys.path:
    sys.path.insert(0, BENCH)


def mtbench(*args, env=None, timeout=300):
    """Runs `python -m mtbench ARGS`; returns the CompletedProcess (text)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = BENCH
    full_env["MTBENCH_BUILD_DIR"] = BUILD
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "mtbench", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)
