"""The on-disk form of a result set, bench/results/<timestamp>/:

  meta.json    what was run: preset, allocators (paths, versions), machine, planned runs, status
  runs.jsonl   one JSON record per finished run, appended as each run ends (so Ctrl-C or a crash
               of the driver loses nothing that finished)
  report.md, *.png, summary.txt   derived: rebuilt from the two files above by `mtbench report DIR`

A run record: bench, allocator, params, rep, argv, status ("ok", "crashed", "failed",
"timeout", "no-result"), detail, wall_s, rusage {user_s, sys_s, minflt, majflt, maxrss_kb (polluted: Linux keeps the
               pre-exec high-water mark, so peak RSS comes from the RESULT line),
nvcsw, nivcsw}, result (the parsed RESULT line) and stderr_tail."""

import json
import os
import time

META = "meta.json"
RUNS = "runs.jsonl"


class StoreError(Exception):
    pass


def new_dir(root):
    """A fresh, timestamp-named result directory under root."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(root, stamp)
    n = 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(root, f"{stamp}-{n}")
    os.makedirs(path)
    return path


def write_meta(directory, meta):
    tmp = os.path.join(directory, META + ".tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, os.path.join(directory, META))


def append_run(directory, record):
    with open(os.path.join(directory, RUNS), "a") as f:
        f.write(json.dumps(record, sort_keys=False) + "\n")
        f.flush()


def load(directory):
    """(meta, runs) of a result directory; a missing or corrupt file is a StoreError."""
    meta_path = os.path.join(directory, META)
    if not os.path.isdir(directory):
        raise StoreError(f"{directory}: no such result directory")
    if not os.path.exists(meta_path):
        raise StoreError(f"{directory}: not an mtbench result directory (no {META})")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise StoreError(f"{meta_path}: unreadable ({e})")
    runs = []
    runs_path = os.path.join(directory, RUNS)
    if os.path.exists(runs_path):
        with open(runs_path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    runs.append(json.loads(line))
                except ValueError:
                    # A driver killed mid-write leaves at most a torn last line; anything else is corruption.
                    if n == sum(1 for _ in open(runs_path)):
                        break
                    raise StoreError(f"{runs_path}:{n}: corrupt record")
    return meta, runs
