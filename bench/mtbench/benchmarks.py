"""The benchmark registry and the presets: which program each benchmark runs, which of its
figures are reported (and which way is better), what the paper expected, and the parameter
points of each preset.

Adding a benchmark = one C file in bench/programs (+ a line in its CMakeLists.txt), one
Benchmark entry below, and its points in the presets that should run it. Nothing else in the
driver names a benchmark, except plots.py, whose special plots are optional (a benchmark without
one gets the generic bar chart)."""

from dataclasses import dataclass, field
import os


# The RESULT fields that measure how fast the allocator runs (a time, or operations per second):
# what "times the default build's time" (issue 12's hardened build) is read from. Page faults,
# RSS, and the false-sharing slowdown (a ratio of the allocator's own two runs) are not.
SPEED_KEYS = frozenset({"worker_mean_s", "pairs_per_s", "ops_per_s", "ops_per_cpu_s", "objects_per_s",
                        "threads_per_s", "elapsed_s", "alloc_s"})


@dataclass(frozen=True)
class Metric:
    key: str              # field of the RESULT line, or of the driver's rusage record ("rusage.minflt")
    label: str
    better: str           # "higher" or "lower"
    fmt: str = "{:.3g}"
    ratios: bool = True   # False for signed figures (a trend), where "times the best" means nothing

    @property
    def speed(self):
        """Whether this metric is a time or a rate of operations (SPEED_KEYS)."""
        return self.key in SPEED_KEYS

    def value(self, run):
        """This metric's figure in one stored run record, or None."""
        if self.key.startswith("rusage."):
            return (run.get("rusage") or {}).get(self.key[len("rusage."):])
        return (run.get("result") or {}).get(self.key)


@dataclass(frozen=True)
class OpCount:
    """How many operations a run did, from its RESULT line: the denominator of qmalloc's
    refills per 1000 operations in the report."""
    text: str             # the RESULT fields used and what one operation is (printed under the table)
    fields: tuple         # the RESULT fields the count is computed from
    formula: object       # result dict -> count; only called when every field is numeric
    only_if: tuple = ()   # (field, value) pairs the RESULT line must have for the count to apply

    def count(self, result):
        """The operation count of one RESULT line, or None where it does not apply."""
        result = result or {}
        if any(result.get(k) != v for k, v in self.only_if):
            return None
        if not all(isinstance(result.get(k), (int, float)) for k in self.fields):
            return None
        return self.formula(result)


@dataclass(frozen=True)
class Benchmark:
    name: str             # the program's file name in build/bench, and the bench= of its RESULT line
    title: str
    source: str           # where the paper describes it
    expectation: str      # one sentence: what the paper found / expected
    metrics: tuple        # first one is the headline used in the summary
    point_keys: tuple     # parameters that tell points apart in tables (CLI option names)
    timeout_s: float = 600.0
    ops: OpCount = None   # None: the program reports no operation count
    own_stats: bool = True  # False: qmalloc's statistics at exit are another process's (real: the launcher's)

    def headline(self, speed=False):
        """The metric that stands for this benchmark in overall figures (the summary's last rows,
        `mtbench compare`'s): its first with ratios, or its first speed metric with ratios; None if
        it has none."""
        return next((m for m in self.metrics if m.ratios and (m.speed or not speed)), None)


# The program's own VmHWM: wait4's ru_maxrss would include the driver's RSS (see bench_common.c).
PEAK_RSS = Metric("peak_rss_kb", "peak RSS (KiB)", "lower", "{:.0f}")

BENCHMARKS = {b.name: b for b in [
    Benchmark(
        "malloc-test", "Benchmark 1: malloc-test (threads vs processes, thread scaling)",
        "Lever & Boreham 2000, section 4.1; 1999 report, appendix B",
        "The paper expects two threads sharing a heap to take about as long as two processes with a heap "
        "each (glibc lost ~10%, Solaris ~9x), and per-thread time to grow linearly past the CPU count with "
        "slope m/n (m: one thread's time, n: CPUs).",
        (Metric("worker_mean_s", "per-worker time (s, null loop subtracted)", "lower"),
         Metric("pairs_per_s", "malloc+free pairs/s (all workers)", "higher")),
        ("processes", "threads", "size", "iterations"),
        ops=OpCount("workers × iterations (malloc+free pairs); threads mode only: in --processes mode the "
                    "workers are forked processes that leave with _exit, so the statistics are the parent's alone",
                    ("workers", "iterations"), lambda r: r["workers"] * r["iterations"], (("mode", "threads"),))),
    Benchmark(
        "heap-leak", "Benchmark 2: heap leakage under cross-thread replacement (after Larson)",
        "Lever & Boreham 2000, sections 4.2 and 5.2",
        "The paper's glibc stayed above but parallel to the lower-bound predictor mpf = a + b*t*r + c*t "
        "(fitted on single-thread runs): some leakage, but no unbounded growth as rounds increase.",
        (Metric("minflt", "minor page faults", "lower", "{:.0f}"), PEAK_RSS),
        ("threads", "objects", "rounds"),
        ops=OpCount("threads × (objects + rounds × replace): every malloc (the initial objects, then one per "
                    "replacement)", ("threads", "objects", "rounds", "replace"),
                    lambda r: r["threads"] * (r["objects"] + r["rounds"] * r["replace"]))),
    Benchmark(
        "false-sharing", "Benchmark 3: false cache-line sharing",
        "Lever & Boreham 2000, sections 4.3 and 5.3",
        "The paper saw objects from malloc that share a cache line run 2x slower with two threads and up "
        "to 4x with four, against cache-line-aligned objects; an allocator that keeps threads' objects "
        "apart should show a slowdown near 1.",
        (Metric("slowdown", "slowdown vs line-aligned objects", "lower", "{:.2f}"),
         Metric("shared_objects", "objects sharing a line", "lower", "{:.0f}")),
        ("threads", "size")),
    Benchmark(
        "t-test1", "t-test1 (ptmalloc's test as run in the TCMalloc paper)",
        "Ghemawat & Menage, TCMalloc, 'Performance Notes'",
        "TCMalloc reported ~7-9 M ops/s for small sizes with any thread count >1 against ptmalloc2's "
        "~4 M with high variance, both dropping as the maximum size grows, and 2-2.5 M ops per CPU-second "
        "against ptmalloc2's 0.5-1 M.",
        (Metric("ops_per_s", "operations/s", "higher"),
         Metric("ops_per_cpu_s", "operations per CPU-second", "higher")),
        ("threads", "max-size"),
        ops=OpCount("ops (malloc, realloc and free calls, all threads)", ("ops",), lambda r: r["ops"])),
    Benchmark(
        "mallbench", "mallbench (HP case study)",
        "Honess, 'Configuring malloc for faster and smaller applications', case study",
        "The seed's tuning raised mallbench from 2.6 M to 5.1-6.1 M malloc ops/s by removing mutex "
        "contention with a thread-local cache, at a cost of about 35% more RSS.",
        (Metric("ops_per_s", "operations/s", "higher"), PEAK_RSS),
        ("threads", "iterations"),
        ops=OpCount("mallocs (malloc calls, all threads)", ("mallocs",), lambda r: r["mallocs"])),
    Benchmark(
        "prodcons", "producer/consumer",
        "Gorine & Knizhnik, 'Tackling memory allocation in multicore and multithreaded applications'",
        "The seed found a per-thread allocator with a pending-free list up to 10x faster than the system "
        "allocator on multicore when producers allocate and consumers free.",
        (Metric("ops_per_s", "malloc+free/s", "higher"), PEAK_RSS),
        ("producers", "consumers"),
        ops=OpCount("objects (each malloc'd by a producer and freed by a consumer)", ("objects",),
                    lambda r: r["objects"])),
    # The memory scenarios (preset "memory"): what stays resident, not how fast.
    Benchmark(
        "two-phase", "Memory: two phases in two threads (300 MB, then 300 MB again)",
        "Ghemawat & Menage, TCMalloc, 'Motivation' (ptmalloc2's per-arena blow-up)",
        "TCMalloc's paper reports that ptmalloc2 can serve the second phase from a fresh arena and add "
        "another 300 MB; an allocator that moves free memory between threads peaks near 300 MB, and one "
        "that returns memory to the system drops after the free, the pause or malloc_trim.",
        (PEAK_RSS, Metric("rss_after_b_kb", "RSS after phase B freed (KiB)", "lower", "{:.0f}"),
         Metric("rss_idle_kb", "RSS after the pause, no allocator call (KiB)", "lower", "{:.0f}"),
         Metric("idle_pct", "RSS after the pause, no allocator call (% of peak)", "lower", "{:.1f}", ratios=False),
         Metric("rss_after_sleep_kb", "RSS after the pause + one malloc/free (KiB)", "lower", "{:.0f}"),
         Metric("rss_after_trim_kb", "RSS after malloc_trim(0) (KiB)", "lower", "{:.0f}")),
        ("megabytes", "sleep")),
    Benchmark(
        "thread-churn", "Memory: thread churn (threads created and exited in sequence)",
        "seed 002 (thread caches returned at thread exit); DESIGN.md",
        "At most one thread's data is live at a time, so RSS at the end should be close to RSS after the "
        "first thread; growth means per-thread caches or arenas outlive their threads.",
        (Metric("rss_end_kb", "RSS at the end (KiB)", "lower", "{:.0f}"),
         Metric("rss_growth_kb", "RSS growth after the first thread (KiB)", "lower", "{:.0f}", ratios=False),
         Metric("threads_per_s", "threads/s", "higher")),
        ("threads", "kilobytes")),
    Benchmark(
        "steady-state", "Memory: producer/consumer at a fixed live set",
        "Gorine & Knizhnik (cross-thread frees); Lever & Boreham section 4.2 (no unbounded growth)",
        "With a constant live set, RSS should level off: a trend near 0 KiB/s once warmed up.",
        (PEAK_RSS, Metric("rss_slope_kb_per_s", "RSS trend, second half (KiB/s)", "lower", "{:.1f}", ratios=False),
         Metric("objects_per_s", "objects/s", "higher")),
        ("pairs", "live")),
    Benchmark(
        "idle-threads", "Memory: idle threads (do their thread caches come back?)",
        "Ghemawat & Menage, TCMalloc, 'Garbage Collection of Thread Caches'; DESIGN.md (thread-cache GC)",
        "TCMalloc's paper garbage-collects a thread cache only when that thread's own frees push it past "
        "its threshold, so a thread that stops allocating keeps its cache (up to 2 MB) until it exits; an "
        "allocator that reclaims idle caches and returns free pages brings RSS back toward where it was "
        "before the workers ran (the RSS-over-time plot shows when).",
        (Metric("rss_last_kb", "RSS at the last sample (KiB)", "lower", "{:.0f}"),
         Metric("kept_pct", "idle excess still resident at the last sample (%)", "lower", "{:.0f}", ratios=False),
         Metric("rss_idle_kb", "RSS when all workers went idle (KiB)", "lower", "{:.0f}")),
        ("threads", "kilobytes", "duration")),
    Benchmark(
        "busy-threads", "More threads than CPUs, each churning blocks of its own",
        "DESIGN.md (a per-thread cache budget shared by all threads: TCMalloc's paper, thread-cache sizing)",
        "With threads well over the CPUs and each thread's working set over its share of a shared thread-cache "
        "budget, an allocator that bounds its caches pays in trips to the shared lists, one that does not in "
        "memory held by threads waiting for a CPU: the rate and the peak RSS show which.",
        (Metric("ops_per_s", "malloc+free/s", "higher"), PEAK_RSS),
        ("threads", "blocks", "max-size", "write-all"),
        ops=OpCount("blocks (each malloc'd, written and freed by one thread)", ("pairs",), lambda r: r["pairs"])),
    Benchmark(
        "release-stall", "Other threads' large allocations while a freed GiB goes back to the system",
        "issue 15 (memory returned to the OS); gperftools issues #754 and #1547 (threads stopped 0.1-1 s "
        "while ReleaseFreeMemory held the page heap's lock across madvise)",
        "An allocator that holds the lock its large blocks need while the kernel drops freed pages (tens of "
        "ms a GiB) stops every thread that needs it for as long; one that drops them outside the lock, or "
        "unmaps each block at its free, does not.",
        (Metric("worst_ms", "slowest worker malloc+free from the frees on (ms)", "lower"),
         Metric("base_worst_ms", "slowest before them (ms): the machine's noise", "lower"), PEAK_RSS),
        ("threads", "free-mb", "block-kb", "trim", "after-ms"),
        ops=OpCount("worker malloc+free pairs", ("pairs",), lambda r: r["pairs"])),
    # The workload classes of issue 15: where a peer was far ahead on a suite of well-known
    # allocator benchmarks, each written here from the description of the class.
    Benchmark(
        "large-blocks", "Large blocks: allocate, write and free 5-25 MiB again and again",
        "issue 15 (a workload class where a peer was 3.7x faster); buffers of image or compression code",
        "An allocator that returns a freed multi-MiB block to the system at once has its pages faulted in "
        "again by the next malloc (time in the kernel, minor faults); one that keeps it for a while reuses it "
        "without faults, at the cost of the retained block in peak RSS.",
        (Metric("elapsed_s", "time (s)", "lower"), Metric("minflt", "minor page faults", "lower", "{:.0f}"), PEAK_RSS),
        ("live", "min-mb", "max-mb", "write-kb", "iterations"),
        ops=OpCount("blocks (each one malloc and one free)", ("iterations",), lambda r: r["iterations"])),
    Benchmark(
        "remote-stream", "Remote frees in a stream: producers fill batches, consumers free them",
        "issue 15 (a workload class where a peer was 2.1x faster); a server handing requests to a cleanup pool",
        "Every free is of an object another thread allocated, in runs of --batch for one owner: an allocator "
        "that batches remote frees per owner pays one exchange per batch, one that takes a lock per object, or "
        "sends every remote free through one lock, serializes.",
        (Metric("ops_per_s", "malloc+free/s", "higher"), PEAK_RSS),
        ("producers", "consumers", "batch"),
        ops=OpCount("objects (each malloc'd by a producer and freed by a consumer; batch headers included)",
                    ("objects",), lambda r: r["objects"])),
    Benchmark(
        "server-mix", "Server-like mix across threads, plain free against C++ sized delete",
        "issue 15 (a workload class where a peer was 1.5x faster with plain free, none with sized delete)",
        "With sized=1 the allocator is told each object's size at free; with sized=0 it must find it from the "
        "pointer. An allocator whose unsized free is as cheap as its sized one shows the same rate at both.",
        (Metric("ops_per_s", "malloc+free/s", "higher"), PEAK_RSS),
        ("sized", "threads"),
        ops=OpCount("allocations (short-lived and long-lived; each is freed once)", ("allocs",), lambda r: r["allocs"])),
    Benchmark(
        "realloc-mix", "Random malloc/free/realloc with objects moving between threads",
        "issue 15 (a workload class where a peer was 1.55x faster)",
        "realloc across size ranges (16 B to 64 KiB, log-uniform) and frees of objects other threads allocated: "
        "an allocator with cheap in-place growth and cheap remote frees leads.",
        (Metric("ops_per_s", "operations/s", "higher"), PEAK_RSS),
        ("threads", "max-size"),
        ops=OpCount("operations (malloc, free, realloc or share; all threads)", ("total_ops",), lambda r: r["total_ops"])),
    Benchmark(
        "churn", "Small-object churn in one thread",
        "issue 15 (a workload class where a peer was 1.19x faster); parsers and interpreters",
        "One thread replaces random members of a live set of small objects, with bursts of temporaries: no "
        "lock is contended, so the rate is the allocator's path length and cache behaviour.",
        (Metric("ops_per_s", "malloc+free/s", "higher"), PEAK_RSS),
        ("live", "max-size"),
        ops=OpCount("mallocs (each replaced or temporary object; frees match)", ("mallocs",), lambda r: r["mallocs"])),
    Benchmark(
        "mixed-stress", "Multi-threaded stress of mixed sizes, threads in generations",
        "issue 15 (a workload class where a peer was 1.21x faster)",
        "Objects from 8 B to 128 KiB in every thread, half of each table freed at once mid-generation, and each "
        "generation's threads freeing what the previous (exited) ones left: every layer of the allocator works.",
        (Metric("ops_per_s", "malloc+free/s", "higher"), PEAK_RSS),
        ("threads", "generations"),
        ops=OpCount("replacements (one free and one malloc each)", ("replacements",), lambda r: r["replacements"])),
    # Real programs, preloaded: time and the peak RSS of the largest process of the tree.
    Benchmark(
        "real", "Real programs: python3, perl, gcc, git, redis, sqlite3 on generated workloads",
        "issue 15 (real programs under LD_PRELOAD: perl 0.84-0.94x glibc's time, gcc 1.00x, python3 0.92-0.96x)",
        "A drop-in allocator should be no slower than the best peer on programs people use, with no more "
        "memory; programs that cannot be installed are skipped (the RESULT line says why).",
        (Metric("elapsed_s", "time (s)", "lower"),
         Metric("tree_peak_rss_kb", "peak RSS of the largest process (KiB)", "lower", "{:.0f}")),
        ("program", "scale"), timeout_s=1800.0, own_stats=False),
    # The heap profiler's accuracy (issue 14): figures only under an allocator with qm_prof_dump.
    Benchmark(
        "prof-accuracy", "Heap profiler accuracy: known call sites, 16 B to 1 MiB, 4 keep and 3 free",
        "issue 14 (every site's live bytes within 10% and its share within 2 points at the default rate; "
        "the leak report names exactly the keeping sites)",
        "A sampled profile estimates each site from its samples, about 1/sqrt(samples) apart from the truth: "
        "at a 2 MiB interval a site needs about 1 GiB live for its estimate to be within 10% nearly always.",
        (Metric("max_err_pct", "worst site's error (%)", "lower"),
         Metric("max_share_err_pts", "worst share error (points)", "lower"),
         Metric("leak_sites_exact", "live bytes at exactly the keeping sites (1 = yes)", "higher", "{:.0f}", ratios=False),
         Metric("samples", "samples in the live profile", "higher", "{:.0f}", ratios=False),
         Metric("alloc_s", "allocation time (s)", "lower")),
        ("megabytes",)),
]}


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _points(**axes):
    """All combinations of the given axes, as a list of parameter dicts (keys are CLI options)."""
    points = [{}]
    for key, values in axes.items():
        values = values if isinstance(values, (list, tuple)) else [values]
        points = [dict(p, **{key: v}) for p in points for v in values]
    return points


def _writer_threads(paper_counts):
    """False sharing needs a CPU per writer: the paper's counts that fit, at least the CPU count."""
    n = cpu_count()
    counts = sorted({c for c in paper_counts if c <= n} | ({min(n, 4)} if n >= 2 else {1}))
    return counts


@dataclass
class Preset:
    name: str
    description: str
    repeat: int
    points: dict = field(default_factory=dict)   # benchmark name -> list of parameter dicts


def _quick():
    # Sized so that every run lasts tens to hundreds of milliseconds (long enough for threads
    # past the CPU count to be time-sliced, as in the paper) and the whole preset takes about
    # 2-3 minutes on 2 cores with 5 allocators.
    sizes_fs = [3, 8, 13, 16, 24, 32, 40, 48, 52, 56, 64, 80, 96, 112, 128]
    return Preset("quick", "every benchmark, small parameters: a few minutes on 2 cores with 5 allocators", 3, {
        "malloc-test":
            _points(threads=[1, 2], size=512, iterations=10_000_000)
            + _points(processes=2, size=512, iterations=10_000_000)
            + _points(threads=[1, 2, 3, 4, 6, 8, 12, 16, 24], size=8192, iterations=2_000_000),
        "heap-leak":
            _points(threads=1, objects=1, rounds=1)
            + _points(threads=[1, 3, 7], objects=10_000, rounds=[1, 2, 4, 8, 16, 32]),
        "false-sharing": _points(threads=_writer_threads([2]), size=sizes_fs, writes=25_000_000),
        "t-test1":
            _points(threads=[1, 2, 4], **{"max-size": [64, 512, 4096]}, iterations=1_000_000)
            + _points(threads=[1, 2, 4], **{"max-size": [16384, 32768, 131072]}, iterations=200_000),
        "mallbench": _points(threads=10, iterations=1_000_000),
        "prodcons":
            _points(pairs=[1, 2, 4], iterations=1_000_000)
            + _points(producers=1, consumers=3, iterations=1_000_000)
            + _points(producers=3, consumers=1, iterations=1_000_000),
        **_issue15_quick(),
    })


# The real family's programs (bench/real/NAME.sh) and the scale each preset gives them; a
# unit is about half a CPU-second to two on this project's 2-core machines, so quick's scale 1
# keeps the family to about a minute with 5 allocators and 3 repetitions.
REAL_PROGRAMS = ["python-objects", "python-tests", "perl-hash", "gcc-compile", "git-gc", "redis", "sqlite"]
REAL_PAPER_SCALE = {"python-objects": 10, "python-tests": 12, "perl-hash": 100, "gcc-compile": 25, "git-gc": 5,
                    "redis": 20, "sqlite": 10}


def _issue15_quick():
    """Points of issue 15's workload classes and the real family in the quick preset."""
    return {
        "large-blocks": _points(live=[1, 3], **{"min-mb": 5, "max-mb": 25}, iterations=60)
                        + _points(live=1, **{"min-mb": 1, "max-mb": 4, "write-kb": 4}, iterations=50_000),
        "remote-stream": _points(producers=1, consumers=1, batches=200, batch=1000)
                         + _points(producers=2, consumers=2, batches=100, batch=1000)
                         + _points(producers=1, consumers=3, batches=200, batch=1000),
        "server-mix": _points(sized=[0, 1], threads=[2, 4], requests=100_000),
        "realloc-mix": _points(threads=[1, 2, 4], ops=300_000),
        "churn": _points(live=[1000, 100_000], ops=1_000_000),
        "mixed-stress": _points(threads=[2, 4], ops=200_000, generations=4),
        "real": [{"program": p, "scale": 1} for p in REAL_PROGRAMS],
    }


def _issue15_paper():
    return {
        "large-blocks": _points(live=[1, 2, 4], **{"min-mb": 5, "max-mb": 25}, iterations=1000)
                        + _points(live=[1, 4], **{"min-mb": 1, "max-mb": 4, "write-kb": 4}, iterations=1_000_000),
        "remote-stream": _points(producers=[1, 2, 4], consumers=[1, 2, 4], batches=1000, batch=1000),
        "server-mix": _points(sized=[0, 1], threads=[1, 2, 4, 8], requests=2_000_000),
        "realloc-mix": _points(threads=[1, 2, 4, 8], ops=3_000_000),
        "churn": _points(live=[1000, 100_000, 1_000_000], ops=20_000_000),
        "mixed-stress": _points(threads=[2, 4, 8], ops=2_000_000, generations=8),
        "real": [{"program": p, "scale": REAL_PAPER_SCALE[p]} for p in REAL_PROGRAMS],
    }


def _paper():
    return Preset("paper", "the papers' own parameters (10 million requests per thread, ...): hours", 5, {
        "malloc-test":
            _points(threads=[1, 2], size=512, iterations=10_000_000)
            + _points(processes=2, size=512, iterations=10_000_000)
            + _points(threads=[1, 2, 3, 4, 5], size=8192, iterations=10_000_000)
            + _points(threads=[16, 24, 32, 40, 48], size=4100, iterations=10_000_000),
        "heap-leak":
            _points(threads=1, objects=1, rounds=1)
            + _points(threads=[1, 3, 7], objects=10_000, rounds=[1, 2, 3, 4, 5, 6, 7, 8])
            + _points(threads=7, objects=10_000, rounds=[16, 32, 64]),
        "false-sharing": _points(threads=_writer_threads([2, 3, 4]), size=list(range(3, 53)) + [64, 96, 128],
                                 writes=100_000_000),
        "t-test1": _points(threads=[1, 2, 3, 4, 5, 8, 12, 16, 20],
                           **{"max-size": [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]},
                           iterations=1_000_000),
        "mallbench": _points(threads=10, iterations=2_000_000),
        "prodcons":
            _points(pairs=[1, 2, 4, 8], iterations=2_000_000)
            + _points(producers=1, consumers=4, iterations=2_000_000)
            + _points(producers=4, consumers=1, iterations=2_000_000),
        **_issue15_paper(),
    })


def _memory():
    """The memory scenarios only (not part of quick): a couple of minutes with 5 allocators."""
    return Preset("memory", "memory scenarios: two phases, thread churn, steady state, idle threads, busy threads, "
                  "release stall", 2, {
        # 12 s: the issue's bound for memory to go back with no allocator calls at all.
        "two-phase": _points(megabytes=300, sleep=12.0),
        "thread-churn": _points(threads=10_000, kilobytes=1024),
        "steady-state": _points(pairs=2, live=100_000, duration=5.0),
        "idle-threads": _points(threads=8, kilobytes=4096, rounds=20, duration=15.0),
        # 64 threads on any machine this runs on: 64 x 64 blocks of 1-16 KiB (35 MB) and 64 x 4 of
        # 100-256 KiB (46 MB) over a 32 MiB thread-cache total (docs/design.md, "the total bounds").
        "busy-threads": _points(threads=64, blocks=64, rounds=2000, **{"min-size": 1024, "max-size": 16384},
                                **{"write-all": [0, 1]})
                        + _points(threads=64, blocks=4, rounds=2000, **{"min-size": 100_000, "max-size": 262_144},
                                  **{"write-all": [0, 1]}),
        # 2 GiB freed, given back by the allocator's own means and by malloc_trim, under one worker
        # (fewer threads than CPUs: the worst pair is the allocator's, not the scheduler's).
        "release-stall": _points(threads=1, **{"free-mb": 2048}, trim=[0, 1]),
    })


def _smoke():
    """Tiny parameters for the driver's own tests: every benchmark, well under a second each."""
    return Preset("smoke", "tiny parameters, for mtbench's tests", 1, {
        "malloc-test": _points(threads=[1, 2, 3], size=512, iterations=2000) + _points(processes=2, size=512, iterations=2000),
        "heap-leak": _points(threads=1, objects=1, rounds=1) + _points(threads=[1, 2], objects=100, rounds=[1, 2]),
        "false-sharing": _points(threads=1, size=[8, 64], writes=1000),
        "t-test1": _points(threads=[1, 2], **{"max-size": [64, 4096]}, iterations=2000),
        "mallbench": _points(threads=2, iterations=2000),
        "prodcons": _points(pairs=1, iterations=2000) + _points(producers=2, consumers=1, iterations=2000),
        "two-phase": _points(megabytes=4, sleep=0),
        "thread-churn": _points(threads=20, kilobytes=64),
        "steady-state": _points(pairs=1, live=1000, duration=0.2, sample=0.02),
        "idle-threads": _points(threads=2, kilobytes=256, rounds=2, duration=1.0),
        "large-blocks": _points(live=2, **{"min-mb": 1, "max-mb": 3}, iterations=4),
        "remote-stream": _points(producers=2, consumers=1, batches=10, batch=100),
        "server-mix": _points(sized=[0, 1], threads=2, requests=1000, slots=200),
        "realloc-mix": _points(threads=2, ops=2000, slots=50, shared=20),
        "churn": _points(live=500, ops=5000),
        "mixed-stress": _points(threads=2, ops=1000, slots=100, generations=2),
        "busy-threads": _points(threads=6, blocks=8, rounds=20, **{"min-size": 1000, "max-size": 70000}, **{"write-all": 0}),
        "release-stall": _points(threads=1, **{"free-mb": 8}, **{"after-ms": 10}),
        "real": _points(program="python-objects", scale=1),
        "prof-accuracy": _points(megabytes=1),
    })


def _profiler():
    """The heap profiler's accuracy at the allocator's own sampling rate (not part of quick: the
    1024 point keeps 4 GiB live): a few minutes per allocator."""
    return Preset("profiler", "heap profiler accuracy at 256 MiB and 1 GiB per call site", 3, {
        "prof-accuracy": _points(megabytes=[256, 1024]),
    })


PRESETS = {"quick": _quick, "paper": _paper, "memory": _memory, "smoke": _smoke, "profiler": _profiler}


def preset(name):
    if name not in PRESETS:
        raise KeyError(name)
    return PRESETS[name]()


def argv_for(params):
    """Program arguments for one parameter point: {"max-size": 64} -> ["--max-size", "64"]."""
    argv = []
    for key, value in params.items():
        argv += [f"--{key}", str(value)]
    return argv


def point_label(bench, params):
    """Short text naming a point in tables: only the keys that vary in the benchmark's points."""
    keys = [k for k in bench.point_keys if k in params] + [k for k in params if k not in bench.point_keys]
    return " ".join(f"{k}={params[k]}" for k in keys)
