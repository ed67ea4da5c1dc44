"""What one allocator costs against another in a result directory, with the run-to-run noise
measured: `mtbench compare DIR BASE OTHER`. Issue figures of the form "at most 1% over sampling
off" or "at most 1.3 times the default build" are ratios of two allocators run side by side; the
report's scores are against the best allocator, and on a shared 2-core machine one point's
repetitions spread by 10-20%, so a ratio with no interval cannot say whether 1.5% is a cost or
noise.

For every metric with ratios (the report's summary rows): per point, OTHER's median over BASE's,
turned so that above 1 means OTHER is worse (slower, bigger); per benchmark and over all points,
the geometric mean; and a 95% interval from a bootstrap: each point's repetitions of each
allocator resampled with replacement, the medians and the mean recomputed, 2,000 times (seeded,
so the figures repeat). Points where either allocator has no successful run are left out and
counted. Pure functions of the stored data, plus the text table."""

import random
import statistics

from . import analysis

RESAMPLES = 2000


class NoRuns(Exception):
    """An allocator named for the comparison has no run in the directory (args[0]: its name)."""


def _cost(base_median, other_median, better):
    """OTHER against BASE, above 1 when OTHER is worse; None where a ratio means nothing."""
    if base_median is None or other_median is None or base_median <= 0 or other_median <= 0:
        return None
    return base_median / other_median if better == "higher" else other_median / base_median


class Comparison:
    """One metric of one benchmark (or all benchmarks' first metrics): the per-point costs and the
    samples the interval is drawn from."""

    def __init__(self, label, pairs, skipped):
        self.label = label
        self.pairs = pairs        # [(base values, other values, "higher" or "lower")] per point, both non-empty
        self.skipped = skipped    # points left out (a side without a successful run)

    def costs(self):
        return [_cost(statistics.median(b), statistics.median(o), better) for b, o, better in self.pairs]

    def mean(self):
        costs = [c for c in self.costs() if c is not None]
        return analysis.gmean(costs) if costs else None

    def interval(self, rng, resamples=RESAMPLES):
        """(low, high) of the 95% bootstrap interval of the geometric mean, or None."""
        means = []
        for _ in range(resamples):
            costs = []
            for b, o, better in self.pairs:
                c = _cost(statistics.median([rng.choice(b) for _ in b]), statistics.median([rng.choice(o) for _ in o]), better)
                if c is not None:
                    costs.append(c)
            if costs:
                means.append(analysis.gmean(costs))
        if not means:
            return None
        means.sort()
        return means[int(0.025 * (len(means) - 1))], means[int(0.975 * (len(means) - 1))]


def comparisons(meta, runs, base, other):
    """[Comparison] per benchmark and metric with ratios, then one over every benchmark's first
    speed metric (a time or a rate: page faults, RSS and the false-sharing slowdown left out), then
    one over every benchmark's first metric (its headline, as in the report's summary). Raises
    NoRuns naming an allocator that has no run in the directory."""
    present = {r["allocator"] for r in runs}
    for name in (base, other):
        if name not in present:
            raise NoRuns(name)
    out, headline_pairs, headline_skipped = [], [], 0
    speed_pairs, speed_skipped = [], 0
    for name, data in analysis.group(meta, runs).items():
        first, first_speed = data.bench.headline(), data.bench.headline(speed=True)
        for metric in data.bench.metrics:
            if not metric.ratios:
                continue
            pairs, skipped = [], 0
            for params in data.points:
                b = data.cell(params, base, metric).values
                o = data.cell(params, other, metric).values
                if b and o:
                    pairs.append((b, o, metric.better))
                else:
                    skipped += 1
            if not pairs and not skipped:
                continue
            out.append(Comparison(f"{name}: {metric.label}", pairs, skipped))
            if metric is first:
                headline_pairs += pairs
                headline_skipped += skipped
            if metric is first_speed:
                speed_pairs += pairs
                speed_skipped += skipped
    out.append(Comparison("all benchmarks, first speed metric each (time or rate)", speed_pairs, speed_skipped))
    out.append(Comparison("all benchmarks, first metric each", headline_pairs, headline_skipped))
    return out


def render(meta, runs, base, other, seed=1):
    """The comparison as text: one line per benchmark and metric, the overall line last."""
    rng = random.Random(seed)
    lines = [f"{other} against {base}: median over median at each point, geometric mean over the points "
             f"(above 1.00: {other} is worse), 95% bootstrap interval over the repetitions", ""]
    rows = []
    for c in comparisons(meta, runs, base, other):
        mean = c.mean()
        iv = c.interval(rng) if mean is not None else None  # no ratio at any point (medians of 0)
        rows.append((c.label, len(c.pairs), mean, iv, c.skipped))
    width = max(len(r[0]) for r in rows)
    lines.append(f"{'benchmark: metric':{width}}  points  {other} / {base}   95% interval")
    for label, n, mean, iv, skipped in rows:
        if mean is None:
            text = "n/a"
        else:
            text = f"{mean:.3f} ({100 * (mean - 1):+.1f}%)"
        ivtext = f"{iv[0]:.3f} .. {iv[1]:.3f}" if iv else "n/a"
        note = f"  ({skipped} point(s) without runs of both)" if skipped else ""
        lines.append(f"{label:{width}}  {n:6d}  {text:16s}  {ivtext}{note}")
    return "\n".join(lines)
