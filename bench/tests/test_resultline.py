"""The RESULT line parser: accepts what the programs print, rejects anything malformed."""

import unittest

import common  # noqa: F401
from mtbench import resultline

GOOD = ("RESULT bench=t-test1 threads=2 max_size=64 elapsed_s=0.25 ops_per_s=4.1e+07 mode=threads "
        "cpu_user_s=0.5 cpu_sys_s=0 minflt=120 peak_rss_kb=2048 rss_end_kb=1900")


class ResultLineTest(unittest.TestCase):
    def test_parses_types(self):
        r = resultline.parse(GOOD)
        self.assertEqual(r["bench"], "t-test1")
        self.assertEqual(r["threads"], 2)
        self.assertIsInstance(r["threads"], int)
        self.assertAlmostEqual(r["ops_per_s"], 4.1e7)
        self.assertEqual(r["mode"], "threads")

    def test_rejects_malformed(self):
        bad = [
            GOOD.replace("RESULT ", "RESULTS "),
            GOOD.replace("threads=2", "threads="),
            GOOD.replace("threads=2", "threads"),
            GOOD.replace("threads=2", "Threads=2"),
            GOOD + " threads=3",
            GOOD.replace("bench=t-test1 ", ""),
            GOOD.replace(" peak_rss_kb=2048", ""),
            GOOD.replace("minflt=120", "minflt=lots"),
        ]
        for line in bad:
            with self.assertRaises(resultline.ResultLineError, msg=line):
                resultline.parse(line)

    def test_exactly_one_line(self):
        self.assertEqual(resultline.find_one("noise\n" + GOOD + "\n")["threads"], 2)
        with self.assertRaises(resultline.ResultLineError):
            resultline.find_one("no result here\n")
        with self.assertRaises(resultline.ResultLineError):
            resultline.find_one(GOOD + "\n" + GOOD + "\n")


if __name__ == "__main__":
    unittest.main()
