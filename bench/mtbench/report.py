"""Renders a stored result set as report.md (per benchmark: what the paper expected, then
tables of median (min-max) and the ratio to the best allocator, then for runs under this
repository's qmalloc the "qmalloc internals" table from its own statistics) and summary.txt (one score per
benchmark metric and allocator), and asks plots.py for the PNGs. Everything comes from
meta.json + runs.jsonl, so `mtbench report DIR` redraws a finished or interrupted run."""

import math
import os
import statistics

from . import analysis, qmstats, store
from .benchmarks import PEAK_RSS, Metric

SUMMARY_NOTE = ("score = geometric mean over the benchmark's parameter points of (best allocator's median / "
                "this allocator's median), inverted where lower is better: 1.00 means best at every point, "
                "1.50 means 1.5x worse on average. 'FAIL' marks an allocator with crashed, failed or timed-out runs. "
                "The last two rows are geometric means over the benchmarks of each one's score on its first "
                "metric, and on its first speed metric (a time or a rate: not page faults, RSS or false-sharing's "
                "slowdown), every benchmark weighing the same; over the benchmarks the allocator has a score on.")


def fmt_value(v, metric=None):
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return "inf"
    a = abs(v)
    if a >= 1e4:
        for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if a >= div:
                return f"{v / div:.3g}{suffix}"
    fmt = metric.fmt if metric else "{:.3g}"
    return fmt.format(v)


def _cell_text(data, params, alloc, metric):
    cell = data.cell(params, alloc, metric)
    if not cell.ok:
        if cell.failures:
            status, detail = cell.failures[0]
            return f"{status.upper()} ({detail})" if detail else status.upper()
        reason = data.skipped(params, alloc)
        return f"skipped ({reason})" if reason else "-"
    ratio = data.ratio_to_best(params, alloc, metric)
    med = fmt_value(cell.median, metric)
    if ratio is not None and math.isfinite(ratio) and abs(ratio - 1.0) < 1e-12:
        med = f"**{med}**"
    spread = f" ({fmt_value(cell.lo, metric)}–{fmt_value(cell.hi, metric)})" if len(cell.values) > 1 else ""
    fail = f" +{len(cell.failures)} failed" if cell.failures else ""
    return f"{med}{spread} ×{ratio:.2f}{fail}" if ratio is not None else f"{med}{spread}{fail}"


def metric_table(data, metric):
    allocs = data.allocators
    lines = [f"| {' '.join(data.varying_keys())} | " + " | ".join(allocs) + " |",
             "|---|" + "---|" * len(allocs)]
    for p in data.points:
        lines.append(f"| {data.label(p)} | " + " | ".join(_cell_text(data, p, a, metric) for a in allocs) + " |")
    return "\n".join(lines)


OVERALL_FIRST = "all benchmarks: first metric (geometric mean of the scores)"
OVERALL_SPEED = "all benchmarks: first speed metric (geometric mean of the scores)"


def overall_scores(groups, speed):
    """{alloc: geometric mean over benchmarks of its score on each one's first metric (its first
    speed metric with speed=True), or None}: the summary's last rows."""
    scores = {}
    for data in groups.values():
        metric = data.bench.headline(speed)
        if metric is None:
            continue
        for a in data.allocators:
            s = data.score(a, metric)
            if s is not None:
                scores.setdefault(a, []).append(s)
    return {a: analysis.gmean(v) for a, v in scores.items()}


def summary_rows(groups):
    """[(row label, {alloc: text})] for the summary table: one per benchmark and metric, then the
    two overall rows."""
    rows = []
    failed = set()
    for data in groups.values():
        failed |= {a for a in data.allocators if data.failures(a)}
        for metric in data.bench.metrics:
            if metric.key in ("shared_objects",) or not metric.ratios:
                continue
            texts = {}
            for a in data.allocators:
                s = data.score(a, metric)
                t = f"{s:.2f}" if s is not None else "-"
                if data.failures(a):
                    t += " FAIL"
                texts[a] = t
            rows.append((f"{data.bench.name}: {metric.label}", texts))
    for label, speed in ((OVERALL_FIRST, False), (OVERALL_SPEED, True)):
        overall = overall_scores(groups, speed)
        if overall:
            rows.append((label, {a: f"{s:.2f}" + (" FAIL" if a in failed else "") for a, s in overall.items()}))
    return rows


def summary_text(meta, groups):
    allocs = []
    for d in groups.values():
        for a in d.allocators:
            if a not in allocs:
                allocs.append(a)
    rows = summary_rows(groups)
    width = max([len(r[0]) for r in rows] + [10])
    colw = max([len(a) for a in allocs] + [9]) + 2
    out = [f"{'':{width}}" + "".join(f"{a:>{colw}}" for a in allocs)]
    for label, texts in rows:
        out.append(f"{label:{width}}" + "".join(f"{texts.get(a, '-'):>{colw}}" for a in allocs))
    out.append("")
    out.append(_wrap(SUMMARY_NOTE, 100))
    return "\n".join(out)


def _wrap(text, width):
    words, lines, cur = text.split(), [], ""
    for w in words:
        if len(cur) + len(w) + 1 > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    return "\n".join(lines + [cur])


# ---- benchmark-specific sections ----------------------------------------------------------

WORKER = Metric("worker_mean_s", "per-worker time", "lower")


def malloc_test_sections(data, ncpu):
    out = []
    # Two threads against two processes at the same size and iteration count.
    procs = [p for p in data.points if p.get("processes") == 2]
    rows = []
    for pp in procs:
        tp = next((p for p in data.points if p.get("threads") == 2 and "processes" not in p
                   and p.get("size") == pp.get("size") and p.get("iterations") == pp.get("iterations")), None)
        if not tp:
            continue
        for a in data.allocators:
            t, pr = data.cell(tp, a, WORKER).median, data.cell(pp, a, WORKER).median
            ratio = f"{t / pr:.2f}" if t and pr else "-"
            rows.append(f"| {a} | {fmt_value(t, WORKER)} | {fmt_value(pr, WORKER)} | {ratio} |")
    if rows:
        out.append("**Two threads vs two processes** (per-worker seconds, median; the paper measured 1.12 for "
                   "glibc 2.0 on 2 CPUs, 1.19 on 4, and 9.0 for Solaris 2.6):\n")
        out.append("| allocator | 2 threads | 2 processes | threads / processes |\n|---|---|---|---|")
        out.extend(rows)
        out.append("")
    # Scaling against the ideal m * max(1, t / n).
    series = scaling_series(data)
    if series:
        size, points = series
        out.append(f"**Thread scaling** (size {size}): measured per-thread time / ideal, where ideal = m·max(1, t/n), "
                   f"m = the allocator's own 1-thread time and n = {ncpu} CPUs. 1.00 is the paper's linear slope.\n")
        out.append("| threads | " + " | ".join(data.allocators) + " |\n|---|" + "---|" * len(data.allocators))
        one = points[0]
        for p in points:
            cells = []
            for a in data.allocators:
                m, v = data.cell(one, a, WORKER).median, data.cell(p, a, WORKER).median
                cells.append(f"{v / (m * max(1.0, p['threads'] / ncpu)):.2f}" if m and v else "-")
            out.append(f"| {p['threads']} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def scaling_series(data):
    """(size, points sorted by threads) of the size with the most thread counts, starting at 1 thread."""
    by_size = {}
    for p in data.points:
        if "processes" not in p and "threads" in p:
            by_size.setdefault(p.get("size"), []).append(p)
    candidates = [(s, sorted(ps, key=lambda p: p["threads"])) for s, ps in by_size.items()
                  if len(ps) >= 3 and min(p["threads"] for p in ps) == 1]
    if not candidates:
        return None
    return max(candidates, key=lambda c: len(c[1]))


def heap_leak_sections(data):
    minflt = data.bench.metrics[0]
    out = []
    preds = {a: analysis.fit_predictor(data, a) for a in data.allocators}
    if not any(preds.values()):
        return "(No single-thread calibration runs, so no predictor.)\n"
    out.append("**Lower-bound predictor** mpf = a + b·t·r + c·t, fitted per allocator on its single-thread runs "
               "(the paper's glibc 2.1 on a K6-2: 14 + 1.1·t·r + 127.6·t):\n")
    out.append("| allocator | predictor |\n|---|---|")
    for a in data.allocators:
        out.append(f"| {a} | {preds[a].formula() if preds[a] else '-'} |")
    out.append("")
    multi = [p for p in data.points if p.get("threads", 1) > 1]
    if multi:
        out.append("**Measured / predicted minor faults** for the multi-thread runs (1.00: no leakage beyond the "
                   "single-thread cost):\n")
        out.append("| threads rounds | " + " | ".join(data.allocators) + " |\n|---|" + "---|" * len(data.allocators))
        for p in multi:
            cells = []
            for a in data.allocators:
                m = data.cell(p, a, minflt).median
                pr = preds[a](p["threads"], p["rounds"]) if preds[a] else None
                cells.append(f"{m:.0f} / {pr:.0f} = {m / pr:.2f}" if m is not None and pr else "-")
            out.append(f"| {p['threads']} {p['rounds']} | " + " | ".join(cells) + " |")
        out.append("")
        # Growth with rounds at the largest thread count, against the predictor's slope b*t.
        t_max = max(p["threads"] for p in multi)
        series = sorted([p for p in multi if p["threads"] == t_max], key=lambda p: p["rounds"])
        if len(series) >= 2:
            parts = []
            for a in data.allocators:
                pts = [(p["rounds"], data.cell(p, a, minflt).median) for p in series]
                pts = [(r, m) for r, m in pts if m is not None]
                if len(pts) >= 2 and preds[a]:
                    _, slope = analysis.fit_line([r for r, _ in pts], [m for _, m in pts])
                    parts.append(f"{a} {slope:+.1f} (predicted {preds[a].b * t_max:+.1f})")
            if parts:
                out.append(f"Here, with {t_max} threads, minor faults grow per extra round by: " + "; ".join(parts) + ".\n")
    return "\n".join(out)


def false_sharing_sections(data):
    slowdown = data.bench.metrics[0]
    parts = []
    for a in data.allocators:
        worst = [(data.cell(p, a, slowdown).median, p) for p in data.points]
        worst = [w for w in worst if w[0] is not None]
        if worst:
            v, p = max(worst, key=lambda w: w[0])
            parts.append(f"{a} {v:.2f} ({data.label(p)})")
    if not parts:
        return ""
    return ("Here, the worst median slowdown per allocator: " + "; ".join(parts) + ". A slowdown near 1 with "
            "shared lines means this machine's CPUs share a cache level where the line lives (e.g. two "
            "hyperthreads of one core), not that the allocator avoided sharing: check the shared-objects table.\n")


def idle_threads_sections(data):
    """Per point and allocator: RSS before the workers, when they went idle and at the last
    sample (medians), and when 90% of the idle excess had come back, if it did."""
    allocs = data.allocators
    kib = Metric("rss_kb", "", "lower", "{:.0f}")
    rows = []
    for p in data.points:
        cells = []
        for a in allocs:
            med = {k: data.cell(p, a, Metric(k, "", "lower")).median
                   for k in ("rss_start_kb", "rss_idle_kb", "rss_last_kb", "duration")}
            if med["rss_idle_kb"] is None:
                cells.append("-")
                continue
            times, n = analysis.reclaim_times(data, p, a)
            if times:
                back = f"90% back after {statistics.median(times):.0f} ms ({len(times)} of {n} runs)"
            else:
                back = f"90% never back within {fmt_value(med['duration'])} s"
            cells.append(f"{fmt_value(med['rss_start_kb'], kib)} → {fmt_value(med['rss_idle_kb'], kib)} → "
                         f"{fmt_value(med['rss_last_kb'], kib)}; {back}")
        rows.append(f"| {data.label(p)} | " + " | ".join(cells) + " |")
    return ("**Does it come back?** RSS in KiB before the workers started → when all were idle → at the last "
            "sample (medians), and the first time after going idle at which RSS fell below the start plus 10% of "
            "the idle excess (median over the runs that got there).\n\n"
            f"| {' '.join(data.varying_keys())} | " + " | ".join(allocs) + " |\n|---|" + "---|" * len(allocs) + "\n"
            + "\n".join(rows) + "\n")


def two_phase_idle_section(data):
    """RSS after the pause with no allocator call, as a share of the peak (issue 15: at most 10%
    after 12 s), next to what one malloc/free and malloc_trim then give back."""
    allocs = data.allocators
    kib = Metric("rss_kb", "", "lower", "{:.0f}")
    rows = []
    for p in data.points:
        cells = []
        for a in allocs:
            med = {k: data.cell(p, a, Metric(k, "", "lower")).median
                   for k in ("idle_pct", "rss_idle_kb", "rss_after_sleep_kb", "rss_after_trim_kb")}
            if med["idle_pct"] is None:
                cells.append("-")
                continue
            mark = "✓" if med["idle_pct"] <= 10 else "✗"
            cells.append(f"{med['idle_pct']:.1f}% {mark} ({fmt_value(med['rss_idle_kb'], kib)}); "
                         f"after a call {fmt_value(med['rss_after_sleep_kb'], kib)}, "
                         f"after trim {fmt_value(med['rss_after_trim_kb'], kib)}")
        rows.append(f"| {data.label(p)} | " + " | ".join(cells) + " |")
    return ("**Memory returned with no allocator call**: RSS after the pause (`sleep`, no allocator call since "
            "everything was freed) as a share of the peak (and in KiB), target at most 10% (✓/✗); then RSS in KiB after one "
            "malloc/free and after malloc_trim(0) (medians).\n\n"
            f"| {' '.join(data.varying_keys())} | " + " | ".join(allocs) + " |\n|---|" + "---|" * len(allocs) + "\n"
            + "\n".join(rows) + "\n")


def against_system_section(data, metric, title, target=None):
    """One metric of every allocator as a multiple of the system allocator's (glibc's), per point."""
    if "system" not in data.allocators:
        return ""
    allocs = data.allocators
    rows = []
    for p in data.points:
        cells = []
        for a in allocs:
            r = data.ratio_to(p, a, "system", metric)
            cells.append("-" if r is None else f"×{r:.2f}" + ("" if target is None else (" ✓" if r <= target else " ✗")))
        rows.append(f"| {data.label(p)} | " + " | ".join(cells) + " |")
    goal = f", target at most ×{target:.2f}" if target else ""
    return (f"**{title}**: median {metric.label} as a multiple of the system allocator's{goal}.\n\n"
            f"| {' '.join(data.varying_keys())} | " + " | ".join(allocs) + " |\n|---|" + "---|" * len(allocs) + "\n"
            + "\n".join(rows) + "\n")


def server_mix_sized_section(data):
    """Per allocator: the rate with C++ sized delete over the rate with plain free (1.00: the
    unsized free costs nothing more)."""
    allocs = data.allocators
    ops = data.bench.metrics[0]
    rows = []
    others = sorted({tuple((k, v) for k, v in p.items() if k != "sized") for p in data.points})
    for rest in others:
        pair = {s: next((p for p in data.points if p.get("sized") == s
                         and tuple((k, v) for k, v in p.items() if k != "sized") == rest), None) for s in (0, 1)}
        if not pair[0] or not pair[1]:
            continue
        cells = []
        for a in allocs:
            free_rate, sized_rate = data.cell(pair[0], a, ops).median, data.cell(pair[1], a, ops).median
            cells.append("-" if not free_rate or not sized_rate else f"×{sized_rate / free_rate:.2f}")
        rows.append(f"| {' '.join(f'{k}={v}' for k, v in rest if k in data.bench.point_keys)} | " + " | ".join(cells) + " |")
    if not rows:
        return ""
    return ("**Sized against unsized free**: malloc+free/s with operator new + sized delete over malloc + free "
            "(above 1: the unsized free costs that much more).\n\n"
            "| point | " + " | ".join(allocs) + " |\n|---|" + "---|" * len(allocs) + "\n" + "\n".join(rows) + "\n")


# ---- qmalloc's own statistics ---------------------------------------------------------------

HIT_RATE_NOTE = ("Hit rate ≈ 1 − refills / mallocs is only an estimate: qmalloc does not count mallocs, so the "
                 "program's operation count stands in for them, and one refill brings a whole batch of objects.")


def fmt_bytes(n):
    if n is None:
        return "-"
    for div, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(n) >= div:
            v = n / div
            return f"{v:.0f} {unit}" if abs(v) >= 100 else f"{v:.3g} {unit}"
    return f"{n:.0f} B"


def _fmt_count(v):
    if v is None:
        return "-"
    if abs(v) >= 1e4:
        return fmt_value(v)
    return f"{v:.0f}" if abs(v) >= 100 or v == int(v) else f"{v:.3g}"


def qmalloc_internals_section(data):
    """The "qmalloc internals" table of one benchmark (one per allocator that stored statistics),
    or a line saying why there is none for qmalloc runs, or "" for a benchmark without any."""
    if not data.bench.own_stats:
        if any(r["allocator"] == "qmalloc" for r in data.runs):
            return ("qmalloc internals: not shown for this benchmark: the statistics line qmalloc prints last "
                    "is the launcher's own, not the measured program's (each process of the tree prints its own "
                    "to stderr).\n")
        return ""
    out = []
    ops = data.bench.ops
    for alloc in qmstats.allocators_with_stats(data):
        rows = qmstats.internals(data, alloc)
        name = "" if alloc == "qmalloc" else f" ({alloc})"
        out.append(f"**qmalloc internals{name}**: qmalloc's own statistics, printed at exit (QMALLOC_STATS=2); "
                   "median over the repetitions of each point, each column on its own.\n")
        first = "refills / 1k ops" if ops else "refills"
        out.append(f"| {' '.join(data.varying_keys())} | {first} | thread caches | transfer caches | in use | "
                   "GC runs | released |\n|---|---|---|---|---|---|---|")
        for p, st in rows:
            refills = _fmt_count(st.refills_per_1k) if ops else _fmt_count(st.refills)
            out.append(f"| {data.label(p)} | {refills} | {fmt_bytes(st.thread_caches)} | "
                       f"{fmt_bytes(st.transfer_caches)} | {fmt_bytes(st.in_use)} | {_fmt_count(st.gc_runs)} | "
                       f"{fmt_bytes(st.released_bytes_total)} |")
        out.append("")
        if ops:
            out.append(f"- refills / 1k ops: thread-cache misses (a malloc that found its thread's list empty and "
                       f"went to the central lists) per 1000 operations, ops = {ops.text}.")
            out.append(f"- {HIT_RATE_NOTE}")
        else:
            out.append("- refills: thread-cache misses (a malloc that found its thread's list empty and went to "
                       "the central lists) over the whole run; this program reports no operation count.")
        out.append("- thread caches, transfer caches: bytes free but held in the threads' caches and in the "
                   "central transfer caches at exit.")
        out.append("- in use: bytes the program still had allocated at exit (after its own frees).")
        out.append("- GC runs: thread-cache garbage collections (idle lists shrunk) over the run.")
        out.append("- released: bytes of free spans returned to the OS over the run (released_bytes_total).")
        out.append("")
    if not out:
        q_runs = [r for r in data.runs if r["allocator"] == "qmalloc" and r["status"] == "ok"]
        if q_runs and all("qmalloc_stats" not in r for r in q_runs):
            out.append("qmalloc internals: not stored for these runs (recorded before mtbench asked qmalloc for "
                       "its statistics).\n")
        elif any("qmalloc_stats" in r for r in q_runs):
            out.append("qmalloc internals: qmalloc printed no statistics line in these runs (see their "
                       "stderr_tail in runs.jsonl).\n")
    return "\n".join(out)


# ---- the whole report -----------------------------------------------------------------------

def _machine_lines(meta):
    m = meta.get("machine", {})
    lines = ["| | |", "|---|---|"]
    for key, label in (("cpu_model", "CPU"), ("cpus_usable", "CPUs usable"), ("mem_total_kb", "memory (KiB)"),
                       ("kernel", "kernel"), ("glibc", "C library"), ("python", "python"), ("repo_commit", "commit")):
        lines.append(f"| {label} | {m.get(key, '-')} |")
    return "\n".join(lines)


def render(directory, make_plots=True):
    """Writes report.md, summary.txt and the plots for a result directory; returns the summary text."""
    meta, runs = store.load(directory)
    groups = analysis.group(meta, runs)
    ncpu = meta.get("machine", {}).get("cpus_usable") or 1
    plot_files, plot_note = {}, ""
    if make_plots:
        try:
            from . import plots
        except ImportError as e:
            plot_note = f"Plots skipped: {e} (run through the virtualenv: `make bench` creates it)."
        else:
            plot_files = plots.render_all(directory, meta, groups)

    md = ["# mtbench report", ""]
    status = "interrupted (Ctrl-C): partial results" if meta.get("interrupted") else meta.get("status", "finished")
    failed = sum(1 for r in runs if r["status"] != "ok")
    md.append(f"Preset **{meta.get('preset', '?')}**, {meta.get('repeat', '?')} repetitions, started "
              f"{meta.get('started', '?')}; {len(runs)} of {meta.get('planned_runs', '?')} planned runs finished, "
              f"{failed} did not succeed; status: {status}.")
    md.append("")
    md.append("## Machine\n")
    md.append(_machine_lines(meta))
    md.append("\n## Allocators\n")
    md.append("| name | library | version |\n|---|---|---|")
    for a in meta.get("allocators", []):
        md.append(f"| {a['name']} | {a.get('path') or '(none: the C library’s malloc)'} | {a.get('version', '')} |")
    for note in meta.get("notes", []):
        md.append(f"\nNote: {note}")
    md.append("\n## Summary\n")
    rows = summary_rows(groups)
    allocs = []
    for d in groups.values():
        allocs += [a for a in d.allocators if a not in allocs]
    md.append("| benchmark: metric | " + " | ".join(allocs) + " |\n|---|" + "---|" * len(allocs))
    for label, texts in rows:
        md.append(f"| {label} | " + " | ".join(texts.get(a, "-") for a in allocs) + " |")
    md.append("\n" + SUMMARY_NOTE)
    if plot_note:
        md.append("\n" + plot_note)
    md.append("\nIn the tables below each cell is the median (min–max) over the repetitions and ×ratio to the best "
              "allocator at that point (best in bold).")
    for name, data in groups.items():
        b = data.bench
        md.append(f"\n## {b.title}\n")
        md.append(f"Source: {b.source}. What the paper expected: {b.expectation}\n")
        if name == "malloc-test":
            md.append(malloc_test_sections(data, ncpu))
        elif name == "heap-leak":
            md.append(heap_leak_sections(data))
        elif name == "false-sharing":
            md.append(false_sharing_sections(data))
        elif name == "idle-threads":
            md.append(idle_threads_sections(data))
        elif name == "two-phase":
            md.append(two_phase_idle_section(data))
        elif name == "prodcons":
            md.append(against_system_section(data, PEAK_RSS, "Peak RSS against glibc", target=1.15))
        elif name == "server-mix":
            md.append(server_mix_sized_section(data))
        for f in plot_files.get(name, []):
            md.append(f"![{name}]({f})\n")
        for metric in b.metrics:
            md.append(f"**{metric.label}** ({metric.better} is better)\n")
            md.append(metric_table(data, metric))
            md.append("")
        internals = qmalloc_internals_section(data)
        if internals:
            md.append(internals)
        fails = [(a, f) for a in data.allocators for f in data.failures(a)]
        if fails:
            md.append("Runs that did not succeed:\n")
            for a, (status, detail, params) in fails:
                md.append(f"- {a}, {data.label(params)}: {status} {detail}")
            md.append("")
    with open(os.path.join(directory, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    summary = summary_text(meta, groups)
    with open(os.path.join(directory, "summary.txt"), "w") as f:
        f.write(summary + "\n")
    return summary
