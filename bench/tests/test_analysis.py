"""The numbers behind the report: medians and ratios to the best, the summary score, the heap
leakage predictor's calibration, and the interleaved run order."""

import math
import unittest

import common  # noqa: F401
from mtbench import analysis, benchmarks, runner
from mtbench.allocators import Allocator


def run(bench, alloc, params, result, status="ok"):
    return {"bench": bench, "allocator": alloc, "params": params, "rep": 0, "status": status,
            "detail": "signal 11 (SIGSEGV)" if status != "ok" else "", "rusage": {},
            "result": result if status == "ok" else None}


class RatioTest(unittest.TestCase):
    def setUp(self):
        p1, p2 = {"threads": 1, "max-size": 64}, {"threads": 2, "max-size": 64}
        self.p1, self.p2 = p1, p2
        runs = []
        for v in (10.0, 12.0, 11.0):
            runs.append(run("t-test1", "a", p1, {"ops_per_s": v, "ops_per_cpu_s": v}))
        for v in (20.0, 22.0, 24.0):
            runs.append(run("t-test1", "b", p1, {"ops_per_s": v, "ops_per_cpu_s": v}))
        runs.append(run("t-test1", "a", p2, {"ops_per_s": 40.0, "ops_per_cpu_s": 1.0}))
        runs.append(run("t-test1", "b", p2, {"ops_per_s": 10.0, "ops_per_cpu_s": 1.0}))
        runs.append(run("t-test1", "b", p2, None, status="crashed"))
        meta = {"allocators": [{"name": "a"}, {"name": "b"}]}
        self.data = analysis.group(meta, runs)["t-test1"]
        self.ops = benchmarks.BENCHMARKS["t-test1"].metrics[0]

    def test_median_min_max(self):
        c = self.data.cell(self.p1, "a", self.ops)
        self.assertEqual((c.median, c.lo, c.hi), (11.0, 10.0, 12.0))

    def test_ratio_to_best_higher_is_better(self):
        self.assertAlmostEqual(self.data.ratio_to_best(self.p1, "a", self.ops), 22.0 / 11.0)
        self.assertAlmostEqual(self.data.ratio_to_best(self.p1, "b", self.ops), 1.0)
        self.assertAlmostEqual(self.data.ratio_to_best(self.p2, "b", self.ops), 4.0)

    def test_score_is_geometric_mean(self):
        self.assertAlmostEqual(self.data.score("a", self.ops), math.sqrt(2.0 * 1.0))
        self.assertAlmostEqual(self.data.score("b", self.ops), math.sqrt(1.0 * 4.0))

    def test_failures_are_kept(self):
        self.assertEqual(len(self.data.failures("b")), 1)
        self.assertEqual(self.data.cell(self.p2, "b", self.ops).failures[0][0], "crashed")
        self.assertEqual(self.data.failures("a"), [])

    def test_lower_is_better(self):
        runs = [run("mallbench", "a", {"threads": 10}, {"ops_per_s": 1, "peak_rss_kb": 3000}),
                run("mallbench", "b", {"threads": 10}, {"ops_per_s": 1, "peak_rss_kb": 2000})]
        data = analysis.group({"allocators": []}, runs)["mallbench"]
        rss = benchmarks.PEAK_RSS
        self.assertAlmostEqual(data.ratio_to_best({"threads": 10}, "a", rss), 1.5)
        self.assertAlmostEqual(data.ratio_to_best({"threads": 10}, "b", rss), 1.0)


class PredictorTest(unittest.TestCase):
    def test_recovers_the_papers_coefficients(self):
        # Synthetic minor-fault counts that follow the paper's own predictor 14 + 1.1tr + 127.6t.
        def mpf(t, r, objects):
            return 14 + 1.1 * t * r + (127.6 * t if objects > 1 else 0)
        runs = [run("heap-leak", "a", {"threads": 1, "objects": 1, "rounds": 1}, {"minflt": 14})]
        for t in (1, 3):
            for r in (1, 2, 4, 8):
                runs.append(run("heap-leak", "a", {"threads": t, "objects": 10000, "rounds": r},
                                {"minflt": mpf(t, r, 10000)}))
        data = analysis.group({"allocators": []}, runs)["heap-leak"]
        pred = analysis.fit_predictor(data, "a")
        self.assertAlmostEqual(pred.a, 14)
        self.assertAlmostEqual(pred.b, 1.1)
        self.assertAlmostEqual(pred.c, 127.6)
        self.assertAlmostEqual(pred(3, 8), mpf(3, 8, 10000))

    def test_no_calibration_no_predictor(self):
        runs = [run("heap-leak", "a", {"threads": 3, "objects": 100, "rounds": 1}, {"minflt": 300})]
        data = analysis.group({"allocators": []}, runs)["heap-leak"]
        self.assertIsNone(analysis.fit_predictor(data, "a"))


class IdleThreadsTest(unittest.TestCase):
    """Reclaim times and the RSS series of idle-threads, from synthetic runs with known answers."""

    P = {"threads": 8, "kilobytes": 4096}

    def data(self, results, extra=()):
        runs = [run("idle-threads", "a", self.P, r) for r in results] + list(extra)
        return analysis.group({"allocators": []}, runs)["idle-threads"]

    def test_reclaim_times_leave_out_never(self):
        data = self.data([{"reclaim_ms": 750.5}, {"reclaim_ms": -1}, {"reclaim_ms": 250}],
                         [run("idle-threads", "a", self.P, None, status="crashed")])
        self.assertEqual(analysis.reclaim_times(data, self.P, "a"), ([750.5, 250], 3))

    def test_series_median_sample_by_sample(self):
        data = self.data([{"rss_series_kb": "100,90,80", "series_step_ms": 500},
                          {"rss_series_kb": "300,70,60,50", "series_step_ms": 500},
                          {"rss_series_kb": "200,80,10", "series_step_ms": 500}])
        self.assertEqual(analysis.rss_series(data, self.P, "a"), ([0.0, 0.5, 1.0], [200, 80, 60]))

    def test_series_single_sample_and_other_schedules(self):
        # One sample parses as a plain number; a run on another schedule is left out, not mixed in.
        data = self.data([{"rss_series_kb": 1234, "series_step_ms": 250},
                          {"rss_series_kb": "1,2", "series_step_ms": 100}])
        self.assertEqual(analysis.rss_series(data, self.P, "a"), ([0.0], [1234]))

    def test_no_series(self):
        data = self.data([{"reclaim_ms": -1}, {"rss_series_kb": "12,x", "series_step_ms": 250}])
        self.assertIsNone(analysis.rss_series(data, self.P, "a"))


class PlanTest(unittest.TestCase):
    def test_interleaved_and_rotated(self):
        preset = benchmarks.preset("smoke")
        allocs = [Allocator("x"), Allocator("y"), Allocator("z")]
        benches = [benchmarks.BENCHMARKS["mallbench"], benchmarks.BENCHMARKS["prodcons"]]
        jobs = runner.plan(preset, benches, allocs, 2)
        n_points = len(preset.points["mallbench"]) + len(preset.points["prodcons"])
        self.assertEqual(len(jobs), 2 * 3 * n_points)
        # Every point's allocators run back to back, and the first allocator rotates per repetition.
        self.assertEqual([j.allocator.name for j in jobs[:3]], ["x", "y", "z"])
        second = jobs[3 * n_points:]
        self.assertEqual([j.allocator.name for j in second[:3]], ["y", "z", "x"])
        self.assertTrue(all(j.rep == 0 for j in jobs[:3 * n_points]))
        for i in range(0, len(jobs), 3):
            self.assertEqual(len({(j.bench.name, str(j.params)) for j in jobs[i:i + 3]}), 1)


if __name__ == "__main__":
    unittest.main()
