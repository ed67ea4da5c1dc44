"""Command line of mtbench:

  python -m mtbench run [--preset quick|paper|smoke] [--allocators a,b] [--alloc name=/path.so]
                        [--bench x,y] [--repeat R] [--out DIR] [--build-dir DIR]
  python -m mtbench report DIR
  python -m mtbench compare DIR BASE OTHER
  python -m mtbench list

Problems the user can fix (unknown names, a missing or unloadable .so, programs not built) end
in one line, "mtbench: error: ...", and exit status 2."""

import argparse
import datetime
import os
import sys

from . import allocators, benchmarks, compare, report, runner, store, sysinfo

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class UsageError(Exception):
    pass


def _csv(text):
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def _positive(text):
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return n


def build_parser():
    p = argparse.ArgumentParser(prog="mtbench", description="Multithreaded malloc benchmarks (the seed papers' "
                                "suite) run under any LD_PRELOAD-able allocator.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a preset and write a result directory with report.md and plots")
    r.add_argument("--preset", default="quick", choices=sorted(benchmarks.PRESETS),
                   help="parameter set (default quick: a few minutes; paper: the papers' parameters, hours)")
    r.add_argument("--allocators", type=_csv, metavar="A,B",
                   help="allocators to run (default: system, qmalloc if built, and every installed peer)")
    r.add_argument("--alloc", action="append", default=[], metavar="NAME=/PATH.so",
                   help="an extra allocator to preload (repeatable)")
    r.add_argument("--bench", type=_csv, metavar="X,Y", help=f"benchmarks to run (default all: "
                   f"{', '.join(benchmarks.BENCHMARKS)})")
    r.add_argument("--repeat", type=_positive, metavar="R", help="repetitions of every run (default: the preset's)")
    r.add_argument("--out", metavar="DIR", help="result directory to create (default bench/results/<timestamp>)")
    r.add_argument("--build-dir", metavar="DIR", help="CMake build directory holding bench/ and libqmalloc.so "
                   "(default: $MTBENCH_BUILD_DIR or build/)")
    rep = sub.add_parser("report", help="rebuild report.md, summary.txt and the plots of a result directory")
    rep.add_argument("dir")
    rep.add_argument("--no-plots", action="store_true", help="tables only")
    cmp = sub.add_parser("compare", help="what OTHER costs against BASE in a result directory, per benchmark "
                         "and overall, with a 95%% interval over the repetitions")
    cmp.add_argument("dir")
    cmp.add_argument("base", metavar="BASE", help="the allocator to compare against (e.g. sampling off)")
    cmp.add_argument("other", metavar="OTHER", help="the allocator whose cost is shown")
    ls = sub.add_parser("list", help="list the allocators found and whether each loads")
    ls.add_argument("--build-dir", metavar="DIR")
    return p


def _build_dir(args):
    return os.path.abspath(args.build_dir or os.environ.get("MTBENCH_BUILD_DIR") or os.path.join(REPO_ROOT, "build"))


def cmd_run(args):
    try:
        preset = benchmarks.preset(args.preset)
    except KeyError:
        raise UsageError(f"unknown preset '{args.preset}'")
    names = args.bench or [n for n in benchmarks.BENCHMARKS if n in preset.points]
    unknown = [n for n in names if n not in benchmarks.BENCHMARKS]
    if unknown:
        raise UsageError(f"unknown benchmark '{unknown[0]}' (known: {', '.join(benchmarks.BENCHMARKS)})")
    benches = [benchmarks.BENCHMARKS[n] for n in names if preset.points.get(n)]
    if not benches:
        raise UsageError(f"preset '{preset.name}' has no points for {', '.join(names)}")
    build_dir = _build_dir(args)
    bin_dir = os.path.join(build_dir, "bench")
    for b in benches:
        exe = os.path.join(bin_dir, b.name)
        if not os.access(exe, os.X_OK):
            raise UsageError(f"{exe} not found: build the programs first (`make`)")
    try:
        allocs, notes = allocators.resolve(args.allocators, args.alloc, REPO_ROOT, build_dir)
    except allocators.AllocatorError as e:
        raise UsageError(str(e))
    repeat = args.repeat or preset.repeat
    jobs = runner.plan(preset, benches, allocs, repeat)
    if args.out:
        out_dir = os.path.abspath(args.out)
        if os.path.exists(os.path.join(out_dir, store.META)):
            raise UsageError(f"{out_dir} already holds results; pick another --out")
        os.makedirs(out_dir, exist_ok=True)
    else:
        out_dir = store.new_dir(os.path.join(REPO_ROOT, "bench", "results"))
    meta = {
        "mtbench": "1",
        "preset": preset.name,
        "repeat": repeat,
        "benchmarks": [b.name for b in benches],
        "allocators": [a.to_json() for a in allocs],
        "notes": notes,
        "machine": sysinfo.collect(REPO_ROOT),
        "command_line": sys.argv,
        "bin_dir": bin_dir,
        "planned_runs": len(jobs),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "status": "running",
    }
    store.write_meta(out_dir, meta)
    for note in notes:
        print(f"mtbench: note: {note}", file=sys.stderr)
    print(f"mtbench: preset {preset.name}, {repeat} repetition(s), allocators {', '.join(a.name for a in allocs)}, "
          f"{len(jobs)} runs -> {out_dir}", file=sys.stderr)
    _, interrupted = runner.execute(jobs, bin_dir, out_dir)
    meta.update(status="interrupted" if interrupted else "finished", interrupted=interrupted,
                finished=datetime.datetime.now().isoformat(timespec="seconds"))
    store.write_meta(out_dir, meta)
    summary = report.render(out_dir)
    print(summary)
    print(f"\nmtbench: report: {os.path.join(out_dir, 'report.md')}")
    return 130 if interrupted else 0


def cmd_report(args):
    try:
        summary = report.render(args.dir, make_plots=not args.no_plots)
    except store.StoreError as e:
        raise UsageError(str(e))
    print(summary)
    print(f"\nmtbench: report: {os.path.join(args.dir, 'report.md')}")
    return 0


def cmd_compare(args):
    try:
        meta, runs = store.load(args.dir)
    except store.StoreError as e:
        raise UsageError(str(e))
    try:
        print(compare.render(meta, runs, args.base, args.other))
    except compare.NoRuns as e:
        there = sorted({r["allocator"] for r in runs})
        raise UsageError(f"allocator '{e.args[0]}' has no runs in {args.dir} (there: {', '.join(there) or 'none'})")
    return 0


def cmd_list(args):
    build_dir = _build_dir(args)
    ldcache = allocators._ldconfig_paths()
    rows = [("system", None)]
    rows.append(("qmalloc", allocators.qmalloc_path(REPO_ROOT, build_dir)))
    for name in allocators.PEERS:
        rows.append((name, allocators.find_peer(name, ldcache)))
    for name, path in rows:
        if name != "system" and (not path or not os.path.exists(path)):
            print(f"{name:10} not found" + (f" ({path})" if path else ""))
            continue
        alloc = allocators.Allocator(name, path)
        try:
            allocators.check_loadable(alloc)
            version = allocators.glibc_version() if not path else (
                allocators.git_version(REPO_ROOT) if name == "qmalloc" else allocators.package_version(path))
            print(f"{name:10} {path or '(C library malloc, no preload)'}  {version}")
        except allocators.AllocatorError as e:
            print(f"{name:10} unusable: {e}")
    return 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return {"run": cmd_run, "report": cmd_report, "compare": cmd_compare, "list": cmd_list}[args.command](args)
    except UsageError as e:
        print(f"mtbench: error: {e}", file=sys.stderr)
        return 2
