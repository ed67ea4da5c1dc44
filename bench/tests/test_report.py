"""`mtbench report DIR` on the stored fixture (a real smoke run: system, jemalloc and a library
that crashes on 512-byte requests): report.md, summary.txt and every plot come from the stored
data alone, the tables show the stored figures, crashes are marked, and redrawing is repeatable."""

import json
import os
import shutil
import statistics
import tempfile
import unittest

from common import FIXTURE, mtbench
from mtbench import benchmarks
from mtbench.report import fmt_value

PLOTS = ["malloc-test-scaling.png", "heap-leak-faults.png", "false-sharing-slowdown.png", "t-test1-ops.png",
         "mallbench-bars.png", "prodcons-bars.png", "two-phase-bars.png", "thread-churn-bars.png",
         "steady-state-bars.png"]


class ReportFromFixtureTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.dir = os.path.join(cls.tmp, "fixture")
        shutil.copytree(FIXTURE, cls.dir)
        cls.proc = mtbench("report", cls.dir)
        cls.runs = [json.loads(l) for l in open(os.path.join(FIXTURE, "runs.jsonl"))]
        with open(os.path.join(cls.dir, "report.md")) as f:
            cls.report = f.read()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_exit_and_summary(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr)
        self.assertIn("report.md", self.proc.stdout)
        with open(os.path.join(self.dir, "summary.txt")) as f:
            summary = f.read()
        header = summary.splitlines()[0].split()
        self.assertEqual(header, ["system", "jemalloc", "crashy"])
        for b in benchmarks.BENCHMARKS.values():
            self.assertIn(f"{b.name}: {b.metrics[0].label}", summary)

    def test_every_benchmark_has_its_section(self):
        for b in benchmarks.BENCHMARKS.values():
            self.assertIn(f"## {b.title}", self.report)
            self.assertIn(b.expectation, self.report)

    def test_plots_are_real_pngs(self):
        for name in PLOTS:
            path = os.path.join(self.dir, name)
            self.assertTrue(os.path.exists(path), name)
            with open(path, "rb") as f:
                head = f.read(8)
            self.assertEqual(head, b"\x89PNG\r\n\x1a\n", name)
            self.assertGreater(os.path.getsize(path), 10_000, name)
            self.assertIn(f"]({name})", self.report)

    def test_table_shows_stored_medians(self):
        params = {"threads": 2, "objects": 100, "rounds": 2}
        for alloc in ("system", "jemalloc"):
            values = [r["result"]["minflt"] for r in self.runs if r["bench"] == "heap-leak"
                      and r["allocator"] == alloc and r["params"] == params]
            self.assertEqual(len(values), 2)
            row = [l for l in self.report.splitlines() if l.startswith("| threads=2 objects=100 rounds=2 |")][0]
            self.assertIn(fmt_value(statistics.median(values), benchmarks.BENCHMARKS["heap-leak"].metrics[0]), row)

    def test_crashes_are_marked(self):
        self.assertIn("CRASHED (signal 11 (SIGSEGV))", self.report)
        self.assertIn("Runs that did not succeed", self.report)
        with open(os.path.join(self.dir, "summary.txt")) as f:
            row = [l for l in f if l.startswith("malloc-test: per-worker")][0]
        self.assertTrue(row.rstrip().endswith("FAIL"), row)

    def test_paper_specific_sections(self):
        self.assertIn("Two threads vs two processes", self.report)
        self.assertIn("Thread scaling", self.report)
        self.assertIn("Lower-bound predictor", self.report)
        self.assertRegex(self.report, r"\| system \| \d+ \+ -?\d+\.\d\d·t·r \+ -?\d+\.\d·t \|")

    def test_redraw_is_repeatable(self):
        again = mtbench("report", self.dir)
        self.assertEqual(again.returncode, 0, again.stderr)
        with open(os.path.join(self.dir, "report.md")) as f:
            self.assertEqual(f.read(), self.report)


if __name__ == "__main__":
    unittest.main()
