"""PNG plots of a stored result set (matplotlib, Agg backend, no display needed), one figure
per benchmark, each drawn only from analysis.BenchData: thread scaling with the paper's ideal
slope, minor faults against rounds with the fitted predictor, slowdown against object size,
t-test1 throughput against maximum size per thread count, idle-threads' RSS over time, and bars
for the rest."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from . import analysis  # noqa: E402
from .benchmarks import Metric  # noqa: E402
from .report import WORKER, scaling_series  # noqa: E402

COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _color(i):
    return COLORS[i % len(COLORS)]


def _series(data, points, alloc, metric, x_key):
    xs, ys, lo, hi = [], [], [], []
    for p in points:
        c = data.cell(p, alloc, metric)
        if c.ok:
            xs.append(p[x_key])
            ys.append(c.median)
            lo.append(c.median - c.lo)
            hi.append(c.hi - c.median)
    return xs, ys, [lo, hi]


def _shared_legend(fig, axes):
    """One legend under all panels instead of one per panel over the data."""
    handles, labels = [], []
    for ax in axes:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(labels) - 1) // 5), 1, 1))


def _save(fig, directory, name):
    if not fig.legends:
        fig.tight_layout()
    fig.savefig(os.path.join(directory, name), dpi=110)
    plt.close(fig)
    return name


def _grid(n):
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def malloc_test(directory, data, ncpu):
    series = scaling_series(data)
    if not series:
        return []
    size, points = series
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, a in enumerate(data.allocators):
        xs, ys, err = _series(data, points, a, WORKER, "threads")
        if not xs:
            continue
        ax.errorbar(xs, ys, yerr=err, marker="o", color=_color(i), label=a, capsize=3)
        one = data.cell(points[0], a, WORKER).median
        if one:
            ideal_x = [p["threads"] for p in points]
            ax.plot(ideal_x, [one * max(1.0, t / ncpu) for t in ideal_x], linestyle="--", color=_color(i), alpha=0.6)
    ax.axvline(ncpu, color="grey", linestyle=":", label=f"{ncpu} CPUs")
    ax.set_xlabel("threads")
    ax.set_ylabel("per-thread time, s (null loop subtracted)")
    ax.set_title(f"malloc-test: thread scaling, {size}-byte requests\n"
                 f"dashed: the paper's ideal m·max(1, t/{ncpu}), m = the allocator's 1-thread time", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return [_save(fig, directory, "malloc-test-scaling.png")]


def heap_leak(directory, data):
    minflt = data.bench.metrics[0]
    preds = {a: analysis.fit_predictor(data, a) for a in data.allocators}
    threads = sorted({p["threads"] for p in data.points if p.get("objects", 0) > 1})
    if not threads:
        return []
    fig, axes = _grid(len(threads))
    for ax, t in zip(axes, threads):
        pts = sorted([p for p in data.points if p["threads"] == t and p.get("objects", 0) > 1], key=lambda p: p["rounds"])
        for i, a in enumerate(data.allocators):
            xs, ys, err = _series(data, pts, a, minflt, "rounds")
            if xs:
                ax.errorbar(xs, ys, yerr=err, marker="o", color=_color(i), label=a, capsize=3)
            if preds[a]:
                rs = [p["rounds"] for p in pts]
                ax.plot(rs, [preds[a](t, r) for r in rs], linestyle="--", color=_color(i), alpha=0.6)
        ax.set_title(f"heap-leak: {t} thread{'s' if t > 1 else ''} (dashed: predictor)")
        ax.set_xlabel("rounds")
        ax.set_ylabel("minor page faults")
        ax.grid(alpha=0.3)
    _shared_legend(fig, axes)
    return [_save(fig, directory, "heap-leak-faults.png")]


def false_sharing(directory, data):
    slowdown = data.bench.metrics[0]
    threads = sorted({p["threads"] for p in data.points})
    fig, axes = _grid(len(threads))
    for ax, t in zip(axes, threads):
        pts = sorted([p for p in data.points if p["threads"] == t], key=lambda p: p["size"])
        for i, a in enumerate(data.allocators):
            xs, ys, err = _series(data, pts, a, slowdown, "size")
            if xs:
                ax.errorbar(xs, ys, yerr=err, marker="o", color=_color(i), label=a, capsize=3)
        ax.axhline(1.0, color="grey", linestyle=":")
        ax.set_title(f"false sharing: {t} writer thread{'s' if t > 1 else ''}")
        ax.set_xlabel("object size, bytes")
        ax.set_ylabel("time / time with line-aligned objects")
        ax.grid(alpha=0.3)
    _shared_legend(fig, axes)
    return [_save(fig, directory, "false-sharing-slowdown.png")]


def t_test1(directory, data):
    ops = data.bench.metrics[0]
    threads = sorted({p["threads"] for p in data.points})
    fig, axes = _grid(len(threads))
    for ax, t in zip(axes, threads):
        pts = sorted([p for p in data.points if p["threads"] == t], key=lambda p: p["max-size"])
        for i, a in enumerate(data.allocators):
            xs, ys, err = _series(data, pts, a, ops, "max-size")
            if xs:
                ax.errorbar(xs, [y / 1e6 for y in ys], yerr=[[e / 1e6 for e in err[0]], [e / 1e6 for e in err[1]]],
                            marker="o", color=_color(i), label=a, capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_title(f"t-test1: {t} thread{'s' if t > 1 else ''}")
        ax.set_xlabel("maximum allocation size, bytes")
        ax.set_ylabel("million operations / s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    _shared_legend(fig, axes)
    return [_save(fig, directory, "t-test1-ops.png")]


def idle_threads(directory, data):
    """RSS over the idle period, a row per point: in MiB (dotted: each allocator's RSS before the
    workers), and as the share of the idle excess still resident, which puts allocators of very
    different footprints on one scale (the dashed line at 10% is the reclaim threshold)."""
    panels = [(p, {a: analysis.rss_series(data, p, a) for a in data.allocators}) for p in data.points]
    panels = [(p, s) for p, s in panels if any(s.values())]
    if not panels:
        return []
    start = Metric("rss_start_kb", "", "lower")
    fig, grid = plt.subplots(len(panels), 2, figsize=(11, 4.2 * len(panels)), squeeze=False)
    for (ax, ax_pct), (p, series) in zip(grid, panels):
        for i, a in enumerate(data.allocators):
            if not series[a]:
                continue
            xs, ys = series[a]
            marker = "." if len(xs) < 40 else None
            ax.plot(xs, [y / 1024 for y in ys], marker=marker, color=_color(i), label=a)
            before = data.cell(p, a, start).median
            if before is None:
                continue
            ax.axhline(before / 1024, color=_color(i), linestyle=":", alpha=0.7)
            if ys[0] > before:
                ax_pct.plot(xs, [100.0 * (y - before) / (ys[0] - before) for y in ys], marker=marker, color=_color(i))
        ax.set_title(f"idle-threads {data.label(p)}: RSS", fontsize=9)
        ax.set_ylabel("RSS, MiB (dotted: before the workers)")
        ax.set_ylim(bottom=0)
        ax_pct.axhline(10, color="grey", linestyle="--", alpha=0.7)
        ax_pct.set_title(f"idle-threads {data.label(p)}: idle excess still resident", fontsize=9)
        ax_pct.set_ylabel("% of (RSS when idle − RSS before)")
        ax_pct.set_ylim(bottom=0)
        for a_ in (ax, ax_pct):
            a_.set_xlabel("seconds since all workers went idle")
            a_.grid(alpha=0.3)
    _shared_legend(fig, list(grid.flat))
    return [_save(fig, directory, "idle-threads-rss.png")]


def bars(directory, data):
    """Grouped bars: one group per point, one bar per allocator, one panel per metric."""
    metrics = data.bench.metrics
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4.6), squeeze=False)
    n = len(data.allocators)
    width = 0.8 / max(n, 1)
    for ax, metric in zip(axes[0], metrics):
        top = max([data.cell(p, a, metric).hi or 0 for p in data.points for a in data.allocators] + [0])
        scale, unit = (1e6, " (millions)") if top >= 1e6 else (1.0, "")
        for i, a in enumerate(data.allocators):
            xs, ys, errs = [], [], [[], []]
            for j, p in enumerate(data.points):
                c = data.cell(p, a, metric)
                if c.ok:
                    xs.append(j + (i - (n - 1) / 2) * width)
                    ys.append(c.median / scale)
                    errs[0].append((c.median - c.lo) / scale)
                    errs[1].append((c.hi - c.median) / scale)
            ax.bar(xs, ys, width, yerr=errs, color=_color(i), label=a, capsize=2)
        ax.set_xticks(range(len(data.points)))
        ax.set_xticklabels([data.label(p).replace(" ", "\n") for p in data.points], fontsize=7)
        ax.set_ylabel(metric.label + unit)
        ax.set_title(f"{data.bench.name}: {metric.label} ({metric.better} is better)", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    _shared_legend(fig, list(axes[0]))
    return [_save(fig, directory, f"{data.bench.name}-bars.png")]


def render_all(directory, meta, groups):
    """{bench name: [png file names]} for every benchmark in groups."""
    ncpu = meta.get("machine", {}).get("cpus_usable") or 1
    out = {}
    for name, data in groups.items():
        if name == "malloc-test":
            files = malloc_test(directory, data, ncpu)
        elif name == "heap-leak":
            files = heap_leak(directory, data)
        elif name == "false-sharing":
            files = false_sharing(directory, data)
        elif name == "t-test1":
            files = t_test1(directory, data)
        elif name == "idle-threads":
            files = idle_threads(directory, data) or bars(directory, data)
        else:
            files = bars(directory, data)
        out[name] = files
    return out
