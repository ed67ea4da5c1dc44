"""qmalloc's statistics in the driver, without running anything: the statistics line is found in
noisy stderr (the last good one wins, malformed or foreign JSON is ignored, nothing else is
removed), only the repository's qmalloc gets QMALLOC_STATS=2 (and not for the real family, whose
line would be another process's), and the report's reduction
(medians per point, refills per 1000 operations of the program) gives the right numbers."""

import json
import os
import unittest

from common import BUILD, FIXTURE_QMALLOC, QMALLOC_SO, REPO
from mtbench import allocators, analysis, benchmarks, qmstats


def stats_line(**fields):
    """A statistics line as qmalloc prints it (same field order, one line), with chosen figures."""
    obj = {"qmalloc": "0.1.0", "in_use": 4096, "thread_caches": 0, "transfer_caches": 0, "central_free": 28672,
           "pageheap_free": 0, "released": 33521664, "metadata": 2359296, "mapped": 35913728,
           "small_in_use": 4096, "large_in_use": 0, "huge_in_use": 0, "huge_blocks": 0, "free_spans": 1,
           "threads": 1, "unclaimed_budget": 33292288, "refills": 1, "flushes": 0, "gc_runs": 0,
           "release_calls": 0, "released_bytes_total": 0,
           "classes": [{"class": 49, "size": 4096, "in_use": 1, "free": 7, "spans": 1}]}
    obj.update(fields)
    return json.dumps(obj)


class ExtractTest(unittest.TestCase):
    def test_line_among_noise(self):
        before = "t-test1: warning: something\n{not json at all\n"
        after = "a destructor's message\n"
        stats, rest = qmstats.extract(before + stats_line(refills=17) + "\n" + after)
        self.assertEqual(stats["refills"], 17)
        self.assertEqual(stats["classes"][0]["class"], 49)
        self.assertEqual(rest, before + after)

    def test_last_good_line_wins(self):
        child = stats_line(refills=1)     # a forked child that exited first
        parent = stats_line(refills=99)
        truncated = parent[:len(parent) // 2]
        text = f"{child}\nmiddle\n{parent}\n{truncated}\n"
        stats, rest = qmstats.extract(text)
        self.assertEqual(stats["refills"], 99)
        self.assertEqual(rest, f"{child}\nmiddle\n{truncated}\n")

    def test_ignores_other_json(self):
        foreign = [
            '{"jemalloc": "5.3", "in_use": 1, "thread_caches": 0, "transfer_caches": 0, "refills": 1, '
            '"gc_runs": 0, "released_bytes_total": 0}',                        # no "qmalloc" key
            '["qmalloc", 1]',                                                  # not an object
            '{"qmalloc": "0.1.0", "in_use": 1}',                               # lacks the figures
            stats_line(refills="many"),                                        # a figure not a number
            stats_line(refills=True),
            '"qmalloc"',
            "",
        ]
        text = "\n".join(foreign) + "\n"
        self.assertEqual(qmstats.extract(text), (None, text))

    def test_line_without_newline_and_surrounding_space(self):
        stats, rest = qmstats.extract("oops\n  " + stats_line(in_use=12345) + "  ")
        self.assertEqual(stats["in_use"], 12345)
        self.assertEqual(rest, "oops\n")

    def test_empty(self):
        self.assertEqual(qmstats.extract(""), (None, ""))


class EnvironmentTest(unittest.TestCase):
    """QMALLOC_STATS=2 for the repository's qmalloc only: not the system allocator, not a peer,
    not a user's .so even when that .so is this very libqmalloc.so."""

    def test_alloc_spec_carries_variables(self):
        """--alloc NAME=/path.so,VAR=value,...: the same library with an option set, beside it."""
        self.assertTrue(os.path.exists(QMALLOC_SO), f"{QMALLOC_SO} not built")
        allocs, _ = allocators.resolve(["system"], [f"qm-nosample={QMALLOC_SO},QMALLOC_PROF_SAMPLE=0,X_Y=a=b,EMPTY="],
                                       REPO, BUILD)
        mine = [a for a in allocs if a.name == "qm-nosample"][0]
        want = {"QMALLOC_PROF_SAMPLE": "0", "X_Y": "a=b", "EMPTY": ""}
        self.assertEqual(mine.path, QMALLOC_SO)
        self.assertEqual(mine.to_json()["env"], want)
        env = mine.env({"PATH": "/bin"})
        self.assertEqual(env, dict(want, PATH="/bin", LD_PRELOAD=QMALLOC_SO))

    def test_only_the_repository_qmalloc(self):
        self.assertTrue(os.path.exists(QMALLOC_SO), f"{QMALLOC_SO} not built")
        allocs, _ = allocators.resolve(None, [f"mine={QMALLOC_SO}"], REPO, BUILD)
        by_name = {a.name: a for a in allocs}
        self.assertIn("qmalloc", by_name)
        self.assertIn("system", by_name)
        self.assertIn("mine", by_name)
        base = {"PATH": "/usr/bin:/bin", "HOME": "/root", "LD_PRELOAD": "/stale.so"}
        for a in allocs:
            env = a.env(base)
            expected = dict(base)
            del expected["LD_PRELOAD"]
            if a.path:
                expected["LD_PRELOAD"] = a.path
            if a.name == "qmalloc":
                expected["QMALLOC_STATS"] = "2"
                self.assertEqual(a.to_json()["env"], {"QMALLOC_STATS": "2"})
                self.assertTrue(qmstats.requested(a.extra_env))
            else:
                self.assertEqual(a.to_json()["env"], {})
                self.assertFalse(qmstats.requested(a.extra_env))
            self.assertEqual(env, expected, a.name)


    def test_no_statistics_where_they_are_another_process(self):
        # The real family's statistics line would be the launcher's, and python3's own test suite
        # fails when its children write to stderr: no QMALLOC_STATS there, and none expected.
        from mtbench import runner
        allocs, _ = allocators.resolve(None, [], REPO, BUILD)
        qm = {a.name: a for a in allocs}["qmalloc"]
        real = runner.Job(benchmarks.BENCHMARKS["real"], {"program": "python-tests", "scale": 1}, qm, 0)
        own = runner.Job(benchmarks.BENCHMARKS["malloc-test"], {"threads": 1}, qm, 0)
        self.assertFalse(benchmarks.BENCHMARKS["real"].own_stats)
        self.assertEqual(real.extra_env(), {})
        self.assertEqual(own.extra_env(), {"QMALLOC_STATS": "2"})
        self.assertNotIn("QMALLOC_STATS", qm.env({"PATH": "/bin"}, extra_env=real.extra_env()))


class OpCountTest(unittest.TestCase):
    def test_counts(self):
        B = benchmarks.BENCHMARKS
        self.assertEqual(B["t-test1"].ops.count({"ops": 4000}), 4000)
        self.assertEqual(B["mallbench"].ops.count({"mallocs": 1234, "frees": 1000}), 1234)
        self.assertEqual(B["prodcons"].ops.count({"objects": 2000}), 2000)
        self.assertEqual(B["heap-leak"].ops.count({"threads": 2, "objects": 100, "rounds": 3, "replace": 50}),
                         2 * (100 + 3 * 50))
        mt = B["malloc-test"].ops
        self.assertEqual(mt.count({"mode": "threads", "workers": 3, "iterations": 2000}), 6000)
        self.assertIsNone(mt.count({"mode": "processes", "workers": 2, "iterations": 2000}))
        self.assertIsNone(B["t-test1"].ops.count({"ops": "n/a"}))
        self.assertIsNone(B["t-test1"].ops.count(None))
        for name in ("false-sharing", "two-phase", "thread-churn", "steady-state"):
            self.assertIsNone(B[name].ops, name)


def run(bench, alloc, params, result, stats, status="ok"):
    r = {"bench": bench, "allocator": alloc, "params": params, "rep": 0, "status": status, "detail": "",
         "rusage": {}, "result": result if status == "ok" else None}
    if stats is not None:
        r["qmalloc_stats"] = stats
    return r


class InternalsTest(unittest.TestCase):
    def test_medians_and_rates(self):
        p1, p2 = {"threads": 1}, {"threads": 2}
        st = lambda **k: json.loads(stats_line(**k))  # noqa: E731
        runs = [
            # Rates per run 10, 20, 60 per 1k: median 20 (not 1000 * median refills / median ops = 25).
            run("t-test1", "qmalloc", p1, {"ops": 1000}, st(refills=10, thread_caches=100, gc_runs=1)),
            run("t-test1", "qmalloc", p1, {"ops": 2000}, st(refills=40, thread_caches=300, gc_runs=2)),
            run("t-test1", "qmalloc", p1, {"ops": 500}, st(refills=30, thread_caches=200, gc_runs=7)),
            run("t-test1", "qmalloc", p1, None, None, status="crashed"),
            run("t-test1", "qmalloc", p2, {"ops": 4000}, st(refills=8, transfer_caches=4096,
                                                            released_bytes_total=65536)),
            run("t-test1", "qmalloc", p2, {"ops": 4000}, None),   # printed no statistics
            run("t-test1", "system", p1, {"ops": 1000}, None),
            run("t-test1", "system", p2, {"ops": 1000}, None),
        ]
        meta = {"allocators": [{"name": "system"}, {"name": "qmalloc"}]}
        data = analysis.group(meta, runs)["t-test1"]
        self.assertEqual(qmstats.allocators_with_stats(data), ["qmalloc"])
        rows = qmstats.internals(data, "qmalloc")
        self.assertEqual([p for p, _ in rows], [p1, p2])
        a, b = rows[0][1], rows[1][1]
        self.assertEqual(a.runs, 3)
        self.assertAlmostEqual(a.refills_per_1k, 20.0)
        self.assertEqual(a.refills, 30)
        self.assertEqual(a.thread_caches, 200)
        self.assertEqual(a.gc_runs, 2)
        self.assertEqual(b.runs, 1)
        self.assertAlmostEqual(b.refills_per_1k, 2.0)
        self.assertEqual(b.transfer_caches, 4096)
        self.assertEqual(b.released_bytes_total, 65536)

    def test_no_rate_where_the_count_does_not_apply(self):
        st = json.loads(stats_line(refills=5))
        runs = [run("malloc-test", "qmalloc", {"processes": 2}, {"mode": "processes", "workers": 2,
                                                                  "iterations": 100}, st)]
        data = analysis.group({"allocators": [{"name": "qmalloc"}]}, runs)["malloc-test"]
        (_, row), = qmstats.internals(data, "qmalloc")
        self.assertIsNone(row.refills_per_1k)
        self.assertEqual(row.refills, 5)

    def test_fixture_holds_real_statistics(self):
        """The fixture is a real run: every qmalloc record has a parsed line whose identity adds up."""
        with open(os.path.join(FIXTURE_QMALLOC, "runs.jsonl")) as f:
            runs = [json.loads(l) for l in f]
        q = [r for r in runs if r["allocator"] == "qmalloc"]
        self.assertTrue(q)
        for r in q:
            s = r["qmalloc_stats"]
            self.assertEqual(r["env"], {"QMALLOC_STATS": "2"})
            parts = ("in_use", "thread_caches", "transfer_caches", "central_free", "pageheap_free", "released",
                     "metadata")
            self.assertEqual(sum(s[k] for k in parts), s["mapped"], r["params"])
            self.assertNotIn('"qmalloc"', r["stderr_tail"])
        for r in runs:
            if r["allocator"] != "qmalloc":
                self.assertNotIn("qmalloc_stats", r)
                self.assertEqual(r["env"], {})


if __name__ == "__main__":
    unittest.main()
