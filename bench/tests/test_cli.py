"""User mistakes end in one clear line and exit status 2: bad flags, unknown names, a missing or
unloadable .so (which LD_PRELOAD alone would only warn about), a result directory that is not one."""

import os
import tempfile
import unittest

from common import BUILD, mtbench


class CliErrorTest(unittest.TestCase):
    def assertError(self, proc, *fragments):
        self.assertEqual(proc.returncode, 2, proc.stderr)
        last = proc.stderr.strip().splitlines()[-1]
        self.assertIn("error:", last)
        for f in fragments:
            self.assertIn(f, last)
        self.assertNotIn("Traceback", proc.stderr)

    def test_bad_flags(self):
        self.assertError(mtbench("run", "--repeat", "0"), "--repeat", "positive integer")
        self.assertError(mtbench("run", "--preset", "huge"), "--preset", "huge")
        self.assertError(mtbench("run", "--no-such-flag"), "--no-such-flag")
        self.assertError(mtbench("frobnicate"), "frobnicate")

    def test_unknown_names(self):
        self.assertError(mtbench("run", "--bench", "nosuch", "--allocators", "system"), "unknown benchmark 'nosuch'")
        self.assertError(mtbench("run", "--allocators", "hoard"), "unknown allocator 'hoard'")
        self.assertError(mtbench("run", "--alloc", "nopath"), "--alloc expects name=/path/lib.so")
        self.assertError(mtbench("run", "--alloc", "jemalloc=/tmp/x.so"), "built-in allocator name")
        self.assertError(mtbench("run", "--alloc", "mine=/tmp/x.so,NOVALUE"), "'NOVALUE'", "is not VAR=value")
        self.assertError(mtbench("run", "--alloc", "mine=/tmp/x.so,LD_PRELOAD=/a.so"), "is not VAR=value")

    def test_missing_so(self):
        with tempfile.TemporaryDirectory() as d:
            missing = os.path.join(d, "libgone.so")
            proc = mtbench("run", "--allocators", "system", "--alloc", f"gone={missing}", "--out", os.path.join(d, "r"))
            self.assertError(proc, "allocator 'gone'", missing, "no such file")
            self.assertFalse(os.path.exists(os.path.join(d, "r", "meta.json")), "nothing may run")

    def test_unloadable_so(self):
        with tempfile.TemporaryDirectory() as d:
            bogus = os.path.join(d, "libbogus.so")
            with open(bogus, "w") as f:
                f.write("this is not an ELF file\n")
            proc = mtbench("run", "--allocators", "system", "--alloc", f"bogus={bogus}", "--out", os.path.join(d, "r"))
            self.assertError(proc, "allocator 'bogus'", "cannot be preloaded")

    def test_report_of_a_non_result_dir(self):
        with tempfile.TemporaryDirectory() as d:
            self.assertError(mtbench("report", d), "not an mtbench result directory")
            self.assertError(mtbench("report", os.path.join(d, "nope")), "no such result directory")

    def test_programs_not_built(self):
        with tempfile.TemporaryDirectory() as d:
            proc = mtbench("run", "--allocators", "system", "--build-dir", d)
            self.assertError(proc, "not found", "make")

    def test_list_names_every_allocator(self):
        proc = mtbench("list")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        names = [line.split()[0] for line in proc.stdout.splitlines()]
        self.assertEqual(names, ["system", "qmalloc", "jemalloc", "tcmalloc", "mimalloc"])


if __name__ == "__main__":
    unittest.main()
