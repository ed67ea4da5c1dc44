"""What the report makes of issue 15's benchmarks, from synthetic runs with known answers: the
two-phase idle share against its 10% target, prodcons peak RSS as a multiple of glibc's, the
sized/unsized ratio of server-mix, a skipped real program, and the presets' new points."""

import unittest

import common  # noqa: F401
from mtbench import analysis, benchmarks, report


def run(bench, alloc, params, result, status="ok"):
    return {"bench": bench, "allocator": alloc, "params": params, "rep": 0, "status": status, "detail": "",
            "rusage": {}, "result": result if status == "ok" else None}


def group(runs, name):
    return analysis.group({"allocators": []}, runs)[name]


class TwoPhaseIdleTest(unittest.TestCase):
    def test_share_and_mark(self):
        p = {"megabytes": 300, "sleep": 12.0}
        fig = {"rss_idle_kb": 5000, "rss_after_sleep_kb": 4000, "rss_after_trim_kb": 2000}
        runs = [run("two-phase", "keeps", p, dict(fig, idle_pct=v)) for v in (60.0, 62.0, 61.0)]
        runs += [run("two-phase", "gives", p, dict(fig, idle_pct=v)) for v in (4.0, 9.0, 30.0)]
        text = report.two_phase_idle_section(group(runs, "two-phase"))
        row = next(line for line in text.splitlines() if line.startswith("| megabytes="))
        cells = [c.strip() for c in row.split("|")[2:-1]]
        self.assertTrue(cells[0].startswith("61.0% ✗"), cells[0])
        self.assertTrue(cells[1].startswith("9.0% ✓"), cells[1])   # the median decides, not the best run
        self.assertIn("after trim 2000", cells[1])


class AgainstSystemTest(unittest.TestCase):
    def test_peak_rss_over_glibc(self):
        p = {"pairs": 1, "iterations": 1000}
        runs = [run("prodcons", "system", p, {"ops_per_s": 1, "peak_rss_kb": 1000}),
                run("prodcons", "lean", p, {"ops_per_s": 1, "peak_rss_kb": 1100}),
                run("prodcons", "fat", p, {"ops_per_s": 1, "peak_rss_kb": 1700})]
        data = group(runs, "prodcons")
        self.assertAlmostEqual(data.ratio_to(p, "fat", "system", benchmarks.PEAK_RSS), 1.7)
        text = report.against_system_section(data, benchmarks.PEAK_RSS, "Peak RSS against glibc", target=1.15)
        self.assertIn("| ×1.00 ✓ | ×1.10 ✓ | ×1.70 ✗ |", text)

    def test_nothing_without_the_system_allocator(self):
        runs = [run("prodcons", "a", {"pairs": 1}, {"ops_per_s": 1, "peak_rss_kb": 1000})]
        self.assertEqual(report.against_system_section(group(runs, "prodcons"), benchmarks.PEAK_RSS, "x"), "")


class ServerMixSizedTest(unittest.TestCase):
    def test_sized_over_unsized_rate(self):
        runs = []
        for threads in (2, 4):
            runs.append(run("server-mix", "a", {"sized": 0, "threads": threads, "requests": 10}, {"ops_per_s": 100.0 * threads}))
            runs.append(run("server-mix", "a", {"sized": 1, "threads": threads, "requests": 10}, {"ops_per_s": 150.0 * threads}))
        text = report.server_mix_sized_section(group(runs, "server-mix"))
        self.assertIn("| threads=2 | ×1.50 |", text)
        self.assertIn("| threads=4 | ×1.50 |", text)


class SkippedRealProgramTest(unittest.TestCase):
    def test_reason_in_the_cell_and_no_figure(self):
        p = {"program": "redis", "scale": 1}
        q = {"program": "perl-hash", "scale": 1}
        runs = [run("real", "a", p, {"program": "redis", "skipped": "redis-server_not_found"}),
                run("real", "a", q, {"program": "perl-hash", "elapsed_s": 2.0, "tree_peak_rss_kb": 100})]
        data = group(runs, "real")
        time = benchmarks.BENCHMARKS["real"].metrics[0]
        self.assertFalse(data.cell(p, "a", time).ok)
        self.assertEqual(data.skipped(p, "a"), "redis-server not found")
        self.assertIsNone(data.skipped(q, "a"))
        self.assertIn("skipped (redis-server not found)", report.metric_table(data, time))


class OverallScoreTest(unittest.TestCase):
    """The summary's last rows: the geometric mean over benchmarks of each one's first-metric score,
    and of its first speed metric's (heap-leak's first metric, page faults, is not one)."""

    def test_overall_rows(self):
        p = {"threads": 1}
        runs = [run("t-test1", "a", p, {"ops_per_s": 100.0, "ops_per_cpu_s": 100.0}),
                run("t-test1", "b", p, {"ops_per_s": 50.0, "ops_per_cpu_s": 50.0}),   # b: 2.0
                run("heap-leak", "a", p, {"minflt": 200.0, "peak_rss_kb": 10.0}),     # a: 2.0
                run("heap-leak", "b", p, {"minflt": 100.0, "peak_rss_kb": 10.0}),
                run("churn", "a", p, {"ops_per_s": 80.0, "peak_rss_kb": 10.0}),        # a: 1.25
                run("churn", "b", p, {"ops_per_s": 100.0, "peak_rss_kb": 10.0})]
        groups = analysis.group({"allocators": []}, runs)
        rows = dict(report.summary_rows(groups))
        first, speed = rows[report.OVERALL_FIRST], rows[report.OVERALL_SPEED]
        # first metrics: a scores 1.0, 2.0, 1.25; b scores 2.0, 1.0, 1.0
        self.assertEqual(first["a"], f"{(1.0 * 2.0 * 1.25) ** (1 / 3):.2f}")
        self.assertEqual(first["b"], f"{2.0 ** (1 / 3):.2f}")
        # speed metrics: t-test1 and churn only
        self.assertEqual(speed["a"], f"{1.25 ** 0.5:.2f}")
        self.assertEqual(speed["b"], f"{2.0 ** 0.5:.2f}")
        self.assertEqual(list(rows)[-2:], [report.OVERALL_FIRST, report.OVERALL_SPEED])


class PresetTest(unittest.TestCase):
    NEW = ("large-blocks", "remote-stream", "server-mix", "realloc-mix", "churn", "mixed-stress", "real")

    def test_every_new_benchmark_in_quick_paper_and_smoke(self):
        for preset in ("quick", "paper", "smoke"):
            points = benchmarks.preset(preset).points
            for name in self.NEW:
                self.assertTrue(points.get(name), f"{name} has no points in {preset}")

    def test_every_real_program_in_quick_and_paper_has_a_script(self):
        import os
        real_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "real")
        for preset in ("quick", "paper"):
            programs = [p["program"] for p in benchmarks.preset(preset).points["real"]]
            self.assertEqual(sorted(programs), sorted(benchmarks.REAL_PROGRAMS), preset)
            for prog in programs:
                self.assertTrue(os.path.isfile(os.path.join(real_dir, prog + ".sh")), prog)

    def test_server_mix_runs_both_frees_in_quick(self):
        points = benchmarks.preset("quick").points["server-mix"]
        self.assertEqual({p["sized"] for p in points}, {0, 1})


if __name__ == "__main__":
    unittest.main()
