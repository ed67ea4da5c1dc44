"""Executes a plan: every benchmark x parameter point x allocator, R times, interleaved so that
machine drift (thermal, background load) hits every allocator alike. Each run is one child
process reaped with os.wait4, whose rusage gives CPU time, minor faults and peak RSS; the
program's own figures come from its RESULT line, and under the repository's qmalloc, qmalloc's
statistics from its stderr (qmstats.py). A run that crashes, fails or hangs is recorded
as such and the plan goes on. Ctrl-C stops the current child and returns what finished."""

from dataclasses import dataclass
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from . import qmstats, resultline, store
from .benchmarks import argv_for


@dataclass
class Job:
    bench: object        # benchmarks.Benchmark
    params: dict
    allocator: object    # allocators.Allocator
    rep: int

    def key(self):
        return (self.bench.name, tuple(sorted(self.params.items())))

    def extra_env(self):
        """The allocator's variables for this run. Where qmalloc's statistics at exit would be
        another process's (the real family: each process of the tree prints its own line, and the
        launcher's comes last), QMALLOC_STATS is left out: the report cannot use them, and a
        measured program that checks its children's stderr fails on them (python3's test_json, in
        the paper preset's python-tests)."""
        env = dict(self.allocator.extra_env)
        if not self.bench.own_stats and qmstats.requested(env):
            del env["QMALLOC_STATS"]
        return env


def plan(preset, benches, allocators, repeat):
    """The ordered job list: repetitions outermost, then benchmark, point, allocator; the
    allocator order rotates each repetition so none always runs first after a point change."""
    jobs = []
    for rep in range(repeat):
        order = allocators[rep % len(allocators):] + allocators[:rep % len(allocators)]
        for bench in benches:
            for params in preset.points.get(bench.name, []):
                for alloc in order:
                    jobs.append(Job(bench, params, alloc, rep))
    return jobs


# How much of the end of stderr is searched for qmalloc's statistics line (a few KiB, printed
# last); the stored tail is shorter.
STDERR_SCAN = 256 * 1024


def _tail(path, limit=2000):
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - limit))
        return f.read().decode("utf-8", "replace")


def run_one(job, bin_dir, timeout_s):
    """Runs one job to completion and returns its record (see store.py)."""
    exe = os.path.join(bin_dir, job.bench.name)
    argv = [exe] + argv_for(job.params)
    extra_env = job.extra_env()
    record = {"bench": job.bench.name, "allocator": job.allocator.name, "params": job.params, "rep": job.rep,
              "argv": argv, "ld_preload": job.allocator.path, "env": extra_env}
    wants_stats = qmstats.requested(extra_env)
    with tempfile.TemporaryFile("w+b") as out, tempfile.NamedTemporaryFile("w+b") as err:
        start = time.monotonic()
        # A session of its own, so a timeout or Ctrl-C can kill the child and anything it forked.
        proc = subprocess.Popen(argv, env=job.allocator.env(extra_env=extra_env), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True)
        timed_out = threading.Event()

        def kill():
            timed_out.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        except BaseException:
            kill()
            os.wait4(proc.pid, 0)
            proc.returncode = -9
            raise
        finally:
            timer.cancel()
        wall = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = _tail(err.name, STDERR_SCAN)
    if wants_stats:
        # The statistics line is stored parsed, and left out of the tail so the program's own last
        # words still end the tail and make the failure detail.
        stats, stderr = qmstats.extract(stderr)
    record.update({
        "wall_s": round(wall, 6),
        "rusage": {"user_s": ru.ru_utime, "sys_s": ru.ru_stime, "minflt": ru.ru_minflt, "majflt": ru.ru_majflt,
                   "maxrss_kb": ru.ru_maxrss, "nvcsw": ru.ru_nvcsw, "nivcsw": ru.ru_nivcsw},
        "stderr_tail": stderr[-1000:],
        "result": None,
    })
    if timed_out.is_set():
        record.update(status="timeout", detail=f"killed after {timeout_s:g} s")
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        record.update(status="crashed", detail=f"signal {sig} ({signal.Signals(sig).name})")
    elif os.WEXITSTATUS(status) != 0:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        record.update(status="failed", detail=f"exit status {os.WEXITSTATUS(status)}: {last}"[:300])
    else:
        try:
            record["result"] = resultline.find_one(stdout)
            record.update(status="ok", detail="")
        except resultline.ResultLineError as e:
            record.update(status="no-result", detail=str(e))
    if wants_stats:
        record["qmalloc_stats"] = stats   # last: the biggest field of the record
    return record


class Progress:
    """One status line: what runs, how many are left, and an estimate of the time left, from the
    mean time of finished runs of the same point (else of the same benchmark, else of all)."""

    def __init__(self, jobs, stream=sys.stderr):
        self.total = len(jobs)
        self.remaining = list(jobs)
        self.done = 0
        self.by_point = {}
        self.by_bench = {}
        self.all = []
        self.stream = stream
        self.tty = stream.isatty()
        self.last_print = 0.0
        self.start = time.monotonic()

    def _mean(self, xs):
        return sum(xs) / len(xs) if xs else None

    def eta_s(self):
        fallback = self._mean(self.all) or 0.5
        total = 0.0
        for job in self.remaining:
            est = self._mean(self.by_point.get(job.key(), [])) or self._mean(self.by_bench.get(job.bench.name, []))
            total += est if est is not None else fallback
        return total

    def starting(self, job):
        self.remaining.pop(0)
        text = (f"[{self.done + 1}/{self.total}] {job.bench.name} {' '.join(f'{k}={v}' for k, v in job.params.items())} "
                f"on {job.allocator.name} (rep {job.rep + 1}); {self.total - self.done - 1} left after this, "
                f"about {_fmt_duration(self.eta_s())} to go")
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r\033[K" + text[:200])
            self.stream.flush()
        elif now - self.last_print >= 10 or self.done == 0:
            self.stream.write(text + "\n")
            self.stream.flush()
            self.last_print = now

    def finished(self, job, record):
        self.done += 1
        self.by_point.setdefault(job.key(), []).append(record["wall_s"])
        self.by_bench.setdefault(job.bench.name, []).append(record["wall_s"])
        self.all.append(record["wall_s"])
        if record["status"] != "ok":
            self.note(f"{job.bench.name} on {job.allocator.name}: {record['status']} ({record['detail']})")

    def note(self, text):
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self):
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(f"finished {self.done} of {self.total} runs in {_fmt_duration(time.monotonic() - self.start)}\n")
        self.stream.flush()


def _fmt_duration(s):
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def execute(jobs, bin_dir, out_dir, progress=None):
    """Runs the jobs in order, appending each record to out_dir; returns (records, interrupted)."""
    records = []
    progress = progress or Progress(jobs)
    try:
        for job in jobs:
            progress.starting(job)
            record = run_one(job, bin_dir, job.bench.timeout_s)
            store.append_run(out_dir, record)
            records.append(record)
            progress.finished(job, record)
    except KeyboardInterrupt:
        progress.note("interrupted: keeping the runs that finished")
        return records, True
    finally:
        progress.close()
    return records, False
