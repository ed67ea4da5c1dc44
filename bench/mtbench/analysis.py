"""Turns stored run records into the numbers the report and plots show: per point and allocator
the median with min and max, the ratio to the best allocator, the summary score, and the heap
leakage predictor fitted on the single-thread runs. Pure functions of the stored data."""

import math
import statistics

from .benchmarks import BENCHMARKS


class Cell:
    """All runs of one benchmark x point x allocator, reduced for one metric."""

    def __init__(self, values, failures):
        self.values = values            # figures of the runs that succeeded
        self.failures = failures        # (status, detail) of those that did not

    @property
    def ok(self):
        return bool(self.values)

    @property
    def median(self):
        return statistics.median(self.values) if self.values else None

    @property
    def lo(self):
        return min(self.values) if self.values else None

    @property
    def hi(self):
        return max(self.values) if self.values else None


def gmean(xs):
    """Geometric mean of positive numbers (the report's scores, mtbench compare's costs)."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def freeze(params):
    return tuple(sorted(params.items()))


class BenchData:
    """The runs of one benchmark, indexed by point and allocator."""

    def __init__(self, bench, runs, allocators):
        self.bench = bench
        self.runs = runs
        self.allocators = [a for a in allocators if any(r["allocator"] == a for r in runs)]
        self.points = []
        seen = set()
        for r in runs:
            key = freeze(r["params"])
            if key not in seen:
                seen.add(key)
                self.points.append(r["params"])

    def varying_keys(self):
        """Parameter names whose value differs between points (the ones a label needs)."""
        keys = []
        for p in self.points:
            for k in p:
                if k not in keys:
                    keys.append(k)
        return [k for k in keys if len({str(p.get(k)) for p in self.points}) > 1] or keys[:1]

    def label(self, params):
        return " ".join(f"{k}={params[k]}" for k in self.varying_keys() if k in params)

    def cell(self, params, alloc, metric):
        key = freeze(params)
        values, failures = [], []
        for r in self.runs:
            if r["allocator"] != alloc or freeze(r["params"]) != key:
                continue
            if r["status"] == "ok":
                v = metric.value(r)
                if isinstance(v, (int, float)) and math.isfinite(v):
                    values.append(v)
            else:
                failures.append((r["status"], r.get("detail", "")))
        return Cell(values, failures)

    def best(self, params, metric):
        medians = [self.cell(params, a, metric).median for a in self.allocators]
        medians = [m for m in medians if m is not None]
        if not medians:
            return None
        return max(medians) if metric.better == "higher" else min(medians)

    def ratio_to_best(self, params, alloc, metric):
        """How many times worse than the best allocator at this point (1.0 = the best)."""
        if not metric.ratios:
            return None
        m = self.cell(params, alloc, metric).median
        best = self.best(params, metric)
        if m is None or best is None:
            return None
        if metric.better == "higher":
            return best / m if m > 0 else math.inf
        if best <= 0:
            return 1.0 if m <= 0 else math.inf
        return m / best

    def score(self, alloc, metric):
        """Geometric mean over points of ratio_to_best: 1.0 means best everywhere."""
        ratios = [self.ratio_to_best(p, alloc, metric) for p in self.points]
        ratios = [r for r in ratios if r is not None and math.isfinite(r) and r > 0]
        if not ratios:
            return None
        return gmean(ratios)

    def skipped(self, params, alloc):
        """The reason a program gave for skipping this point (the real family's missing tools), or None."""
        key = freeze(params)
        for r in self.runs:
            if r["allocator"] == alloc and freeze(r["params"]) == key and r["status"] == "ok":
                reason = (r.get("result") or {}).get("skipped")
                if reason:
                    return str(reason).replace("_", " ")
        return None

    def ratio_to(self, params, alloc, other, metric):
        """This allocator's median over another's at one point (e.g. peak RSS against the system's)."""
        m, o = self.cell(params, alloc, metric).median, self.cell(params, other, metric).median
        if m is None or o is None or o <= 0:
            return None
        return m / o

    def failures(self, alloc):
        return [(r["status"], r.get("detail", ""), r["params"]) for r in self.runs
                if r["allocator"] == alloc and r["status"] != "ok"]


def group(meta, runs):
    """{bench name: BenchData} in the registry's order, for the benchmarks present in runs."""
    allocs = [a["name"] for a in meta.get("allocators", [])]
    for r in runs:
        if r["allocator"] not in allocs:
            allocs.append(r["allocator"])
    out = {}
    names = list(BENCHMARKS) + sorted({r["bench"] for r in runs} - set(BENCHMARKS))
    for name in names:
        bench_runs = [r for r in runs if r["bench"] == name]
        if bench_runs and name in BENCHMARKS:
            out[name] = BenchData(BENCHMARKS[name], bench_runs, allocs)
    return out


# ---- heap leakage predictor ----------------------------------------------------------------

def fit_line(xs, ys):
    """Least-squares (intercept, slope); a single distinct x gives slope 0."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


class Predictor:
    """mpf_lower = a + b*t*r + c*t (Lever & Boreham, section 5.2), calibrated per allocator:
    a from the one-object single-round run, b and a + c from a line through the single-thread
    runs of n objects over the rounds."""

    def __init__(self, a, b, c, objects):
        self.a, self.b, self.c, self.objects = a, b, c, objects

    def __call__(self, threads, rounds):
        return self.a + self.b * threads * rounds + self.c * threads

    def formula(self):
        return f"{self.a:.0f} + {self.b:.2f}·t·r + {self.c:.1f}·t"


def fit_predictor(data, alloc):
    """The Predictor for one allocator from heap-leak data, or None without calibration runs."""
    from .benchmarks import Metric
    minflt = Metric("minflt", "", "lower")
    base = [p for p in data.points if p.get("threads") == 1 and p.get("objects") == 1]
    single = [p for p in data.points if p.get("threads") == 1 and p.get("objects", 0) > 1]
    if not base or not single:
        return None
    a = data.cell(base[0], alloc, minflt).median
    # Calibrate on the object count the multi-thread points use.
    objects = max({p["objects"] for p in single}, key=lambda n: sum(q.get("objects") == n for q in data.points))
    pairs = [(p["rounds"], data.cell(p, alloc, minflt).median) for p in single if p["objects"] == objects]
    pairs = [(r, m) for r, m in pairs if m is not None]
    if a is None or not pairs:
        return None
    intercept, b = fit_line([r for r, _ in pairs], [m for _, m in pairs])
    return Predictor(a, b, intercept - a, objects)


# ---- idle threads: reclaim time and the RSS series -------------------------------------------

def _ok_runs(data, params, alloc):
    key = freeze(params)
    return [r for r in data.runs if r["allocator"] == alloc and freeze(r["params"]) == key and r["status"] == "ok"]


def reclaim_times(data, params, alloc):
    """(times in ms of the runs whose RSS fell below start + 10% of the idle excess, number of
    successful runs) for one idle-threads point and allocator; reclaim_ms = -1 means never."""
    runs = _ok_runs(data, params, alloc)
    times = [r["result"]["reclaim_ms"] for r in runs
             if isinstance(r["result"].get("reclaim_ms"), (int, float)) and r["result"]["reclaim_ms"] >= 0]
    return times, len(runs)


def parse_series(text):
    """The RESULT line's comma-separated series as a list of numbers; a single sample is parsed as
    a plain number by the result-line parser, hence str(). None if any entry is not a number."""
    try:
        return [float(x) for x in str(text).split(",")]
    except ValueError:
        return None


def rss_series(data, params, alloc):
    """(seconds, median RSS in KiB at each) over the successful runs of one idle-threads point and
    allocator, sample by sample (the runs share one schedule), or None without a stored series."""
    series, step_ms = [], None
    for r in _ok_runs(data, params, alloc):
        s = parse_series(r["result"].get("rss_series_kb", ""))
        step = r["result"].get("series_step_ms")
        if s and isinstance(step, (int, float)) and step_ms in (None, step):
            series.append(s)
            step_ms = step
    if not series:
        return None
    n = min(len(s) for s in series)
    return [i * step_ms / 1000.0 for i in range(n)], [statistics.median(s[i] for s in series) for i in range(n)]
