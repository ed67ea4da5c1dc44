"""`mtbench compare DIR BASE OTHER`: the cost of one allocator against another, per benchmark and
overall, oriented so that above 1 is worse whatever the metric's direction, with a bootstrap
interval that holds a clear difference away from 1 and a tie around it."""

import json
import os
import random
import tempfile
import unittest

from common import mtbench
from mtbench import compare


def run(bench, alloc, params, result, rep=0, status="ok"):
    return {"bench": bench, "allocator": alloc, "params": params, "rep": rep, "status": status,
            "detail": "" if status == "ok" else "signal 11 (SIGSEGV)", "rusage": {},
            "result": result if status == "ok" else None}


def runs_of(bench, alloc, params, key, values):
    return [run(bench, alloc, params, {key: v}, rep=i) for i, v in enumerate(values)]


META = {"allocators": [{"name": "base"}, {"name": "other"}]}


class CompareTest(unittest.TestCase):
    def comparison(self, runs, label_start):
        for c in compare.comparisons(META, runs, "base", "other"):
            if c.label.startswith(label_start):
                return c
        self.fail(f"no comparison '{label_start}'")

    def test_higher_is_better_half_the_speed_costs_two(self):
        p = {"threads": 1, "max-size": 64}
        runs = runs_of("t-test1", "base", p, "ops_per_s", [10.0, 11.0, 12.0]) + \
            runs_of("t-test1", "other", p, "ops_per_s", [5.0, 5.5, 6.0])
        c = self.comparison(runs, "t-test1: operations/s")
        self.assertAlmostEqual(c.mean(), 2.0)
        low, high = c.interval(random.Random(1))
        self.assertTrue(1.0 < low <= 2.0 <= high, (low, high))

    def test_lower_is_better_twice_the_time_costs_two(self):
        p = {"threads": 1, "size": 512, "iterations": 1000}
        runs = runs_of("malloc-test", "base", p, "worker_mean_s", [1.0, 1.1, 0.9]) + \
            runs_of("malloc-test", "other", p, "worker_mean_s", [2.0, 2.2, 1.8])
        c = self.comparison(runs, "malloc-test: per-worker time")
        self.assertAlmostEqual(c.mean(), 2.0)
        self.assertGreater(c.interval(random.Random(1))[0], 1.0)

    def test_a_tie_is_one_and_its_interval_holds_one(self):
        rng = random.Random(7)
        runs = []
        for t in (1, 2, 4):
            p = {"threads": t, "max-size": 64}
            for alloc in ("base", "other"):
                runs += runs_of("t-test1", alloc, p, "ops_per_s", [100 + rng.uniform(-10, 10) for _ in range(5)])
        c = self.comparison(runs, "t-test1: operations/s")
        low, high = c.interval(random.Random(1))
        self.assertTrue(low < 1.0 < high, (c.mean(), low, high))
        self.assertLess(abs(c.mean() - 1.0), 0.1)

    def test_overall_row_uses_each_benchmarks_first_metric(self):
        runs = runs_of("t-test1", "base", {"threads": 1}, "ops_per_s", [10.0]) + \
            runs_of("t-test1", "other", {"threads": 1}, "ops_per_s", [5.0]) + \
            runs_of("malloc-test", "base", {"threads": 1}, "worker_mean_s", [1.0]) + \
            runs_of("malloc-test", "other", {"threads": 1}, "worker_mean_s", [1.0])
        overall = compare.comparisons(META, runs, "base", "other")[-1]
        self.assertEqual(len(overall.pairs), 2)
        self.assertAlmostEqual(overall.mean(), 2.0 ** 0.5)  # costs 2 and 1

    def test_speed_row_leaves_out_faults_and_rss(self):
        # heap-leak's first metric is page faults: in the overall row, not in the speed row, which
        # takes large-blocks' time (its first metric) and not its faults.
        runs = runs_of("heap-leak", "base", {"threads": 1}, "minflt", [100.0]) + \
            runs_of("heap-leak", "other", {"threads": 1}, "minflt", [100.0]) + \
            [run("large-blocks", "base", {"live": 1}, {"elapsed_s": 1.0, "minflt": 10.0}),
             run("large-blocks", "other", {"live": 1}, {"elapsed_s": 3.0, "minflt": 10.0})]
        rows = compare.comparisons(META, runs, "base", "other")
        speed, overall = rows[-2], rows[-1]
        self.assertTrue(speed.label.startswith("all benchmarks, first speed metric"))
        self.assertEqual(len(speed.pairs), 1)
        self.assertAlmostEqual(speed.mean(), 3.0)
        self.assertEqual(len(overall.pairs), 2)
        self.assertAlmostEqual(overall.mean(), 3.0 ** 0.5)

    def test_a_point_without_both_sides_is_left_out_and_counted(self):
        p1, p2 = {"threads": 1, "max-size": 64}, {"threads": 2, "max-size": 64}
        runs = runs_of("t-test1", "base", p1, "ops_per_s", [10.0]) + runs_of("t-test1", "other", p1, "ops_per_s", [10.0]) + \
            runs_of("t-test1", "base", p2, "ops_per_s", [10.0]) + [run("t-test1", "other", p2, None, status="crashed")]
        c = self.comparison(runs, "t-test1: operations/s")
        self.assertEqual((len(c.pairs), c.skipped), (1, 1))
        self.assertIn("1 point(s) without runs of both", compare.render(META, runs, "base", "other"))

    def test_an_allocator_without_runs_is_named(self):
        runs = runs_of("t-test1", "base", {"threads": 1}, "ops_per_s", [10.0])
        with self.assertRaises(compare.NoRuns):
            compare.comparisons(META, runs, "base", "other")


class CompareCliTest(unittest.TestCase):
    def test_table_and_errors(self):
        with tempfile.TemporaryDirectory() as d:
            p = {"threads": 1, "max-size": 64}
            runs = runs_of("t-test1", "base", p, "ops_per_s", [10.0, 11.0, 12.0]) + \
                runs_of("t-test1", "other", p, "ops_per_s", [5.0, 5.5, 6.0])
            with open(os.path.join(d, "meta.json"), "w") as f:
                json.dump(META, f)
            with open(os.path.join(d, "runs.jsonl"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in runs)
            proc = mtbench("compare", d, "base", "other")
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn("t-test1: operations/s", proc.stdout)
            self.assertIn("2.000 (+100.0%)", proc.stdout)
            bad = mtbench("compare", d, "base", "nosuch")
            self.assertEqual(bad.returncode, 2)
            self.assertIn("allocator 'nosuch' has no runs", bad.stderr.strip().splitlines()[-1])
            self.assertIn("there: base, other", bad.stderr)
            gone = mtbench("compare", os.path.join(d, "nope"), "base", "other")
            self.assertEqual(gone.returncode, 2)
            self.assertIn("no such result directory", gone.stderr)


if __name__ == "__main__":
    unittest.main()
