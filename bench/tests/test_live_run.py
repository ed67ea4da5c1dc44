"""An end-to-end run of the real programs with the smoke preset: the system allocator next to a
preloaded library that crashes on 512-byte requests. The crash is recorded with its signal, the
other benchmark still runs under that library, and the report and summary mark the crash."""

import json
import os
import tempfile
import unittest

from common import CRASH_ALLOC, mtbench


class LiveRunTest(unittest.TestCase):
    def test_run_survives_a_crashing_allocator(self):
        self.assertTrue(os.path.exists(CRASH_ALLOC), f"{CRASH_ALLOC} not built")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "results")
            proc = mtbench("run", "--preset", "smoke", "--allocators", "system", "--alloc", f"crashy={CRASH_ALLOC}",
                           "--bench", "malloc-test,heap-leak", "--out", out, env={"MTBENCH_TEST_CRASH_SIZE": "512"})
            self.assertEqual(proc.returncode, 0, proc.stderr)
            with open(os.path.join(out, "meta.json")) as f:
                meta = json.load(f)
            runs = [json.loads(l) for l in open(os.path.join(out, "runs.jsonl"))]
            self.assertEqual(len(runs), meta["planned_runs"])
            self.assertEqual(meta["status"], "finished")
            self.assertEqual([a["name"] for a in meta["allocators"]], ["system", "crashy"])

            crashed = [r for r in runs if r["allocator"] == "crashy" and r["bench"] == "malloc-test"]
            self.assertTrue(crashed)
            for r in crashed:
                if "processes" in r["params"]:
                    # The forked workers die; their parent notices and fails cleanly.
                    self.assertEqual(r["status"], "failed")
                    self.assertIn("worker process", r["detail"])
                else:
                    self.assertEqual(r["status"], "crashed")
                    self.assertIn("SIGSEGV", r["detail"])
                self.assertEqual(r["ld_preload"], CRASH_ALLOC)
            for r in runs:
                if not (r["allocator"] == "crashy" and r["bench"] == "malloc-test"):
                    self.assertEqual(r["status"], "ok", r)
                    self.assertEqual(r["result"]["bench"], r["bench"])
                    self.assertGreater(r["rusage"]["user_s"] + r["rusage"]["sys_s"] + r["wall_s"], 0)
            # The exact command is stored and reproduces the parameters.
            r0 = runs[0]
            self.assertTrue(r0["argv"][0].endswith("/bench/" + r0["bench"]))
            for k, v in r0["params"].items():
                i = r0["argv"].index("--" + k)
                self.assertEqual(r0["argv"][i + 1], str(v))

            report = open(os.path.join(out, "report.md")).read()
            self.assertIn("CRASHED (signal 11 (SIGSEGV))", report)
            summary_line = [l for l in proc.stdout.splitlines() if l.startswith("malloc-test: per-worker")][0]
            self.assertIn("FAIL", summary_line)
            self.assertIn(f"report: {out}/report.md", proc.stdout)


if __name__ == "__main__":
    unittest.main()
