"""qmalloc's own statistics for runs under this repository's qmalloc: the environment that asks
for them (QMALLOC_STATS=2 makes qmalloc print one JSON object on one stderr line at exit), finding
that line in a run's stderr among whatever else the program printed, and reducing the stored
objects to the figures the report's "qmalloc internals" table shows.

The object describes the heap at exit (what the program had not freed, what sits in caches) plus
counters over the whole run (refills, gc_runs, released_bytes_total); docs/stats.md in the
repository explains every field."""

import json
import statistics

from .analysis import freeze

# Set in the child's environment for the repository's qmalloc only (allocators.py).
STATS_ENV = {"QMALLOC_STATS": "2"}



def requested(extra_env):
    """Whether a run with these extra environment variables prints the statistics line."""
    return extra_env.get("QMALLOC_STATS") == STATS_ENV["QMALLOC_STATS"]


# The figures the report reads; an object lacking one of them is not qmalloc's statistics line.
REQUIRED = ("in_use", "thread_caches", "transfer_caches", "refills", "gc_runs", "released_bytes_total")


def parse_line(line):
    """The statistics object of one stderr line, or None if the line is not one."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "qmalloc" not in obj:
        return None
    if not all(isinstance(obj.get(k), (int, float)) and not isinstance(obj.get(k), bool) for k in REQUIRED):
        return None
    return obj


def extract(stderr):
    """(statistics object, stderr without that line) from a run's stderr text.

    The last line that parses is qmalloc's own at the program's exit: any earlier one comes from a
    child process that exited first. Only that line is taken out, so the program's own messages
    (and their order) stay as they were for crash diagnosis. (None, stderr) if there is none."""
    lines = stderr.splitlines(keepends=True)
    for i in range(len(lines) - 1, -1, -1):
        obj = parse_line(lines[i])
        if obj is not None:
            return obj, "".join(lines[:i] + lines[i + 1:])
    return None, stderr


# ---- reduction for the report ---------------------------------------------------------------

class Internals:
    """Medians over the repetitions of one point of one allocator, each figure on its own."""

    def __init__(self, stats, ops):
        self.runs = len(stats)
        self.refills = _median([s["refills"] for s in stats])
        # Per run before the median, so a slow and a fast repetition are not mixed in one ratio.
        rates = [1000.0 * s["refills"] / n for s, n in zip(stats, ops) if n]
        self.refills_per_1k = _median(rates) if len(rates) == len(stats) else None
        self.thread_caches = _median([s["thread_caches"] for s in stats])
        self.transfer_caches = _median([s["transfer_caches"] for s in stats])
        self.in_use = _median([s["in_use"] for s in stats])
        self.gc_runs = _median([s["gc_runs"] for s in stats])
        self.released_bytes_total = _median([s["released_bytes_total"] for s in stats])


def _median(xs):
    return statistics.median(xs) if xs else None


def has_stats(run):
    return run.get("status") == "ok" and isinstance(run.get("qmalloc_stats"), dict)


def allocators_with_stats(data):
    """Allocators of a BenchData with at least one successful run that stored statistics."""
    return [a for a in data.allocators if any(r["allocator"] == a and has_stats(r) for r in data.runs)]


def internals(data, alloc):
    """[(point, Internals)] for one allocator of a BenchData, in the points' order; points
    without a successful run with statistics are left out."""
    out = []
    for p in data.points:
        key = freeze(p)
        runs = [r for r in data.runs if r["allocator"] == alloc and freeze(r["params"]) == key and has_stats(r)]
        if runs:
            ops = [data.bench.ops.count(r["result"]) if data.bench.ops else None for r in runs]
            out.append((p, Internals([r["qmalloc_stats"] for r in runs], ops)))
    return out
