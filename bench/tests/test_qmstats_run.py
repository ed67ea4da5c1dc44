"""qmalloc's statistics captured by real runs. A probe program (a bash script run under the real
libqmalloc.so, so the statistics line is qmalloc's own; bash, because dash leaves with _exit and
never runs qmalloc's exit handler) shows that the qmalloc run gets exactly one
more environment variable than the system run, that the line is stored parsed and kept out of the
stderr tail, and that a failing run's detail is still the program's last message. Then a smoke run
of t-test1 through `mtbench run` stores statistics for qmalloc only and reports them."""

import json
import os
import stat
import tempfile
import unittest
from unittest import mock

from common import QMALLOC_SO, mtbench
from mtbench import benchmarks, runner
from mtbench.allocators import Allocator
from mtbench.qmstats import STATS_ENV

# Builtins only, so the one process under the preload is the shell itself: its statistics line
# is the only real one on stderr. The exported environment goes, NAME=value NUL-separated, to
# <dir of the script>/<tag>.env.
PROBE = r"""#!/bin/bash
tag=$2 fail=$4
for n in $(compgen -e); do printf '%s=%s\0' "$n" "${!n}"; done > "${0%/*}/$tag.env"
echo "probe: a warning before" >&2
echo '{"qmalloc": "0.1.0", "in_use": ' >&2
if [ "$fail" = 1 ]; then echo "probe: boom" >&2; exit 1; fi
echo "RESULT bench=probe tag=$tag cpu_user_s=0 cpu_sys_s=0 minflt=1 peak_rss_kb=1 rss_end_kb=1"
"""


def read_env(path):
    with open(path, "rb") as f:
        entries = f.read().decode().split("\0")
    return dict(e.split("=", 1) for e in entries if e)


class ProbeRunTest(unittest.TestCase):
    def setUp(self):
        self.assertTrue(os.path.exists(QMALLOC_SO), f"{QMALLOC_SO} not built")
        self.tmp = tempfile.TemporaryDirectory()
        self.bin = self.tmp.name
        path = os.path.join(self.bin, "probe")
        with open(path, "w") as f:
            f.write(PROBE)
        os.chmod(path, stat.S_IRWXU)
        self.bench = benchmarks.Benchmark("probe", "probe", "", "", (), ())
        self.qmalloc = Allocator("qmalloc", QMALLOC_SO, "", "this repository", dict(STATS_ENV))
        self.system = Allocator("system", None, "", "system")

    def tearDown(self):
        self.tmp.cleanup()

    def run_probe(self, alloc, tag, fail=0):
        job = runner.Job(self.bench, {"tag": tag, "fail": fail}, alloc, 0)
        with mock.patch.dict(os.environ):
            os.environ.pop("QMALLOC_STATS", None)
            os.environ.pop("LD_PRELOAD", None)
            return runner.run_one(job, self.bin, 60)

    def test_environment_and_capture(self):
        env_file = os.path.join(self.bin, "same.env")
        q = self.run_probe(self.qmalloc, "same")
        qenv = read_env(env_file)
        s = self.run_probe(self.system, "same")
        senv = read_env(env_file)
        self.assertEqual(q["status"], "ok", q)
        self.assertEqual(s["status"], "ok", s)
        self.assertEqual(q["result"]["tag"], "same")

        # The same program sees the same environment but for the preload and the statistics switch.
        self.assertIn("PATH", senv)
        diff = {k for k in set(qenv) | set(senv) if qenv.get(k) != senv.get(k)}
        self.assertEqual(diff, {"LD_PRELOAD", "QMALLOC_STATS"})
        self.assertEqual(qenv["QMALLOC_STATS"], "2")
        self.assertEqual(qenv["LD_PRELOAD"], QMALLOC_SO)
        self.assertEqual(q["argv"], s["argv"])

        # What is stored: the change of environment, and the parsed line of the shell's qmalloc.
        self.assertEqual(q["env"], {"QMALLOC_STATS": "2"})
        self.assertEqual(s["env"], {})
        stats = q["qmalloc_stats"]
        self.assertIsInstance(stats, dict)
        self.assertIn("qmalloc", stats)
        self.assertGreater(stats["mapped"], 0)
        self.assertGreater(stats["refills"], 0)   # the shell allocated from empty thread caches
        self.assertNotIn("qmalloc_stats", s)

        # The program's own stderr stays, the malformed line included; only the parsed line goes.
        for rec in (q, s):
            self.assertIn("probe: a warning before\n", rec["stderr_tail"])
            self.assertIn('{"qmalloc": "0.1.0", "in_use": \n', rec["stderr_tail"])
        self.assertTrue(q["stderr_tail"].endswith('"in_use": \n'), q["stderr_tail"])
        self.assertEqual(q["stderr_tail"].count('"qmalloc"'), 1)

    def test_failure_detail_is_the_programs_last_line(self):
        q = self.run_probe(self.qmalloc, "f", fail=1)
        self.assertEqual(q["status"], "failed")
        self.assertEqual(q["detail"], "exit status 1: probe: boom")
        self.assertTrue(q["stderr_tail"].endswith("probe: boom\n"), q["stderr_tail"])
        # exit() still ran qmalloc's exit handler: the statistics are kept for the failed run too.
        self.assertIsInstance(q["qmalloc_stats"], dict)


class SmokeRunTest(unittest.TestCase):
    def test_t_test1_under_system_and_qmalloc(self):
        self.assertTrue(os.path.exists(QMALLOC_SO), f"{QMALLOC_SO} not built")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "results")
            proc = mtbench("run", "--preset", "smoke", "--allocators", "system,qmalloc", "--bench", "t-test1",
                           "--out", out)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            with open(os.path.join(out, "runs.jsonl")) as f:
                runs = [json.loads(l) for l in f]
            points = benchmarks.preset("smoke").points["t-test1"]
            q = [r for r in runs if r["allocator"] == "qmalloc"]
            self.assertEqual(len(q), len(points))
            for r in q:
                self.assertEqual(r["status"], "ok", r)
                self.assertEqual(r["env"], {"QMALLOC_STATS": "2"})
                self.assertGreater(r["qmalloc_stats"]["refills"], 0)
                self.assertEqual(r["stderr_tail"], "")
            for r in runs:
                if r["allocator"] == "system":
                    self.assertNotIn("qmalloc_stats", r)
                    self.assertEqual(r["env"], {})
            with open(os.path.join(out, "report.md")) as f:
                report = f.read()
            section = report.split("**qmalloc internals**", 1)[1]
            for p in points:
                self.assertIn(f"| threads={p['threads']} max-size={p['max-size']} |", section)


if __name__ == "__main__":
    unittest.main()
