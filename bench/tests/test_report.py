"""`mtbench report DIR` on the stored fixtures. fixture/ (a real smoke run: system, jemalloc and a
library that crashes on 512-byte requests, recorded before qmalloc's statistics were stored; its
idle-threads runs were recorded later, with the same allocators, and appended, and so were issue
15's benchmarks and the real family, and two-phase again once it reported its idle figure):
report.md, summary.txt and every plot come from the stored data alone, the tables show the stored
figures, crashes are marked, and redrawing is repeatable. fixture-qmalloc/ (a real smoke run of
system and qmalloc, two repetitions): the "qmalloc internals" table of every benchmark shows the
medians of the stored statistics; the same runs stripped of their statistics still report."""

import json
import os
import shutil
import statistics
import tempfile
import unittest

from common import FIXTURE, FIXTURE_QMALLOC, mtbench
from mtbench import benchmarks
from mtbench.report import fmt_bytes, fmt_value

PLOTS = ["malloc-test-scaling.png", "heap-leak-faults.png", "false-sharing-slowdown.png", "t-test1-ops.png",
         "mallbench-bars.png", "prodcons-bars.png", "two-phase-bars.png", "thread-churn-bars.png",
         "steady-state-bars.png", "idle-threads-rss.png"]


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

    def test_idle_threads_section_shows_stored_figures(self):
        body = sections(self.report)[benchmarks.BENCHMARKS["idle-threads"].title]
        cells = dict(zip(["system", "jemalloc", "crashy"], table_rows(body, "| threads | system")[0][1:]))
        kib = benchmarks.Metric("rss_kb", "", "lower", "{:.0f}")
        for alloc in ("system", "jemalloc"):
            runs = [r for r in self.runs if r["bench"] == "idle-threads" and r["allocator"] == alloc]
            self.assertEqual([r["status"] for r in runs], ["ok", "ok"])
            med = {k: statistics.median(r["result"][k] for r in runs) for k in ("rss_start_kb", "rss_idle_kb", "rss_last_kb")}
            self.assertTrue(cells[alloc].startswith(f"{fmt_value(med['rss_start_kb'], kib)} → "
                                                    f"{fmt_value(med['rss_idle_kb'], kib)} → "
                                                    f"{fmt_value(med['rss_last_kb'], kib)}; "), cells[alloc])
            reached = [r["result"]["reclaim_ms"] for r in runs if r["result"]["reclaim_ms"] >= 0]
            if reached:
                self.assertIn(f"90% back after {statistics.median(reached):.0f} ms ({len(reached)} of 2 runs)", cells[alloc])
            else:
                self.assertIn("90% never back within 1 s", cells[alloc])
        self.assertEqual(cells["crashy"], "-")
        self.assertIn("![idle-threads](idle-threads-rss.png)", body)

    def test_no_internals_without_qmalloc(self):
        self.assertNotIn("qmalloc internals", self.report)

    def test_redraw_is_repeatable(self):
        again = mtbench("report", self.dir)
        self.assertEqual(again.returncode, 0, again.stderr)
        with open(os.path.join(self.dir, "report.md")) as f:
            self.assertEqual(f.read(), self.report)


def sections(report):
    """{benchmark title: its text up to the next benchmark} of a report.md."""
    out = {}
    for chunk in report.split("\n## ")[1:]:
        title, _, body = chunk.partition("\n")
        out[title] = body
    return out


def table_rows(text, header_start):
    """The data rows (cells as lists) of the first table whose header starts with header_start."""
    lines = text.splitlines()
    i = next(n for n, l in enumerate(lines) if l.startswith(header_start))
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


class QmallocInternalsReportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.dir = os.path.join(cls.tmp, "fixture-qmalloc")
        shutil.copytree(FIXTURE_QMALLOC, cls.dir)
        cls.proc = mtbench("report", cls.dir, "--no-plots")
        with open(os.path.join(FIXTURE_QMALLOC, "runs.jsonl")) as f:
            cls.runs = [json.loads(l) for l in f]
        with open(os.path.join(cls.dir, "report.md")) as f:
            cls.report = f.read()
        cls.sections = sections(cls.report)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def stored(self, bench, params, field):
        return [r["qmalloc_stats"][field] for r in self.runs if r["bench"] == bench and r["allocator"] == "qmalloc"
                and r["params"] == params]

    def internals_rows(self, bench):
        body = self.sections[benchmarks.BENCHMARKS[bench].title]
        return body, {row[0]: row[1:] for row in table_rows(body.split("**qmalloc internals**", 1)[1], "| ")}

    def test_exit(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr)

    def test_one_table_per_benchmark_after_its_metric_tables(self):
        for b in benchmarks.BENCHMARKS.values():
            body = self.sections[b.title]
            if not b.own_stats:   # the real family: the stored statistics are the launcher's
                self.assertNotIn("**qmalloc internals**", body, b.name)
                self.assertIn("qmalloc internals: not shown for this benchmark", body, b.name)
                continue
            self.assertEqual(body.count("**qmalloc internals**"), 1, b.name)
            last_metric = body.index(f"**{b.metrics[-1].label}**")
            self.assertLess(last_metric, body.index("**qmalloc internals**"), b.name)

    def test_t_test1_rows_are_medians_of_the_stored_statistics(self):
        body, rows = self.internals_rows("t-test1")
        self.assertIn("| threads max-size | refills / 1k ops | thread caches | transfer caches | in use | GC runs "
                      "| released |", body)
        self.assertIn("ops = ops (malloc, realloc and free calls, all threads)", body)
        self.assertIn("Hit rate ≈ 1 − refills / mallocs is only an estimate", body)
        for p in benchmarks.preset("smoke").points["t-test1"]:
            runs = [r for r in self.runs if r["bench"] == "t-test1" and r["allocator"] == "qmalloc"
                    and r["params"] == p]
            self.assertEqual(len(runs), 2)
            rates = [1000 * r["qmalloc_stats"]["refills"] / r["result"]["ops"] for r in runs]
            row = rows[f"threads={p['threads']} max-size={p['max-size']}"]
            self.assertAlmostEqual(float(row[0]), statistics.median(rates), delta=0.005 * statistics.median(rates))
            self.assertEqual(row[1], fmt_bytes(statistics.median(self.stored("t-test1", p, "thread_caches"))))
            self.assertEqual(row[2], fmt_bytes(statistics.median(self.stored("t-test1", p, "transfer_caches"))))
            self.assertEqual(row[3], fmt_bytes(statistics.median(self.stored("t-test1", p, "in_use"))))
            self.assertEqual(float(row[4]), statistics.median(self.stored("t-test1", p, "gc_runs")))
            self.assertEqual(row[5], fmt_bytes(statistics.median(self.stored("t-test1", p, "released_bytes_total"))))

    def test_benchmark_without_op_count_shows_refills(self):
        body, rows = self.internals_rows("false-sharing")
        self.assertIn("| size | refills | thread caches |", body)
        self.assertIn("this program reports no operation count", body)
        for p in benchmarks.preset("smoke").points["false-sharing"]:
            self.assertEqual(float(rows[f"size={p['size']}"][0]),
                             statistics.median(self.stored("false-sharing", p, "refills")))

    def test_malloc_test_processes_has_no_rate(self):
        body, rows = self.internals_rows("malloc-test")
        self.assertEqual(rows["processes=2"][0], "-")
        rate = float(rows["threads=2"][0])
        p = {"threads": 2, "size": 512, "iterations": 2000}
        self.assertAlmostEqual(rate, 1000 * statistics.median(self.stored("malloc-test", p, "refills")) / (2 * 2000),
                               delta=0.01 * rate)
        self.assertIn("leave with _exit", body)

    def test_idle_threads_caches_seen_at_exit(self):
        # The program exits without joining its idle workers, so qmalloc's exit statistics still
        # count their caches: every worker's cache and the main thread's are live.
        body, rows = self.internals_rows("idle-threads")
        p = benchmarks.preset("smoke").points["idle-threads"][0]
        runs = [r for r in self.runs if r["bench"] == "idle-threads" and r["allocator"] == "qmalloc"]
        self.assertEqual(len(runs), 2)
        for r in runs:
            self.assertEqual(r["qmalloc_stats"]["threads"], p["threads"] + 1)
            self.assertGreater(r["qmalloc_stats"]["thread_caches"], 0)
        self.assertEqual(rows[f"threads={p['threads']}"][1], fmt_bytes(statistics.median(self.stored("idle-threads", p, "thread_caches"))))

    def test_fmt_bytes(self):
        self.assertEqual(fmt_bytes(0), "0 B")
        self.assertEqual(fmt_bytes(1023), "1023 B")
        self.assertEqual(fmt_bytes(1536), "1.5 KiB")
        self.assertEqual(fmt_bytes(200 * 1024), "200 KiB")
        self.assertEqual(fmt_bytes(3 * 1024 * 1024 + 512 * 1024), "3.5 MiB")
        self.assertEqual(fmt_bytes(None), "-")

    def test_results_from_before_the_statistics_still_report(self):
        with tempfile.TemporaryDirectory() as d:
            old = os.path.join(d, "old")
            os.makedirs(old)
            shutil.copy(os.path.join(FIXTURE_QMALLOC, "meta.json"), old)
            with open(os.path.join(old, "runs.jsonl"), "w") as f:
                for r in self.runs:
                    r = {k: v for k, v in r.items() if k not in ("qmalloc_stats", "env")}
                    f.write(json.dumps(r) + "\n")
            proc = mtbench("report", old, "--no-plots")
            self.assertEqual(proc.returncode, 0, proc.stderr)
            with open(os.path.join(old, "report.md")) as f:
                report = f.read()
            self.assertNotIn("**qmalloc internals**", report)
            self.assertEqual(report.count("qmalloc internals: not stored for these runs"),
                             sum(1 for b in benchmarks.BENCHMARKS.values() if b.own_stats))
            # Up to the first benchmark's internals (the summary, malloc-test's tables), nothing changes.
            self.assertEqual(report.split("qmalloc internals: not stored")[0],
                             self.report.split("**qmalloc internals**")[0])

    def test_redraw_is_repeatable(self):
        again = mtbench("report", self.dir, "--no-plots")
        self.assertEqual(again.returncode, 0, again.stderr)
        with open(os.path.join(self.dir, "report.md")) as f:
            self.assertEqual(f.read(), self.report)


if __name__ == "__main__":
    unittest.main()
