#!/usr/bin/env bash
# Fast-path measurements.
#   tools/fastpath.sh count [QMALLOC_SO]      instructions per malloc+free pair under callgrind, per
#                                             size (16 B..32 KiB) and pattern (hot pair, batch of 64,
#                                             page empties, mixed 16..512), malloc and free apart,
#                                             for qmalloc and every installed peer
#   tools/fastpath.sh count A.so B.so ...     the same for the given libraries only, side by side,
#                                             with the change from the first (before/after); a
#                                             library may be named: before=old/libqmalloc.so, and
#                                             given options: off=build/libqmalloc.so,QMALLOC_PROF_SAMPLE=0
#   tools/fastpath.sh asm [QMALLOC_SO]        disassembly of qm_malloc and qm_free
# Instruction counts are repeatable (callgrind counts, it does not time), so they can be compared
# across runs and machines of one architecture; docs/fastpath.md keeps the current figures and
# says what the probe (tools/fastpath_bench.c) does.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() { echo "usage: tools/fastpath.sh count|asm [path/to/libqmalloc.so | [NAME=]A.so[,VAR=VALUE...] ...]" >&2; exit 2; }
mode=${1:-count}
shift || true
case "$mode" in count|asm) ;; *) usage ;; esac
[[ $# -eq 0 ]] && set -- "$here/../build/libqmalloc.so"
for arg in "$@"; do
  so=${arg#*=}; so=${so%%,*}
  [[ "$arg" == *=* && -z "${arg%%=*}" ]] && { echo "fastpath.sh: empty name in '$arg'" >&2; exit 2; }
  [[ -f "$so" ]] || { echo "fastpath.sh: $so not found (run make first)" >&2; exit 2; }
  if [[ "$arg" == *,* ]]; then
    IFS=, read -ra vars <<<"${arg#*,}"
    for var in "${vars[@]}"; do
      [[ "$var" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { echo "fastpath.sh: '$var' in '$arg' is not VAR=VALUE" >&2; exit 2; }
    done
  fi
done
case "$mode" in
  asm)
    [[ $# -eq 1 ]] || usage
    so=${1#*=}
    for fn in qm_malloc qm_free; do
      echo "== $fn"
      gdb -batch -ex "disassemble $fn" "$so" 2>/dev/null | grep -v '^End\|^Dump' ||
        objdump -d --no-show-raw-insn "$so" | awk -v f="<$fn>:" '$2==f{p=1} p&&/^$/{exit} p'
    done ;;
  count)
    command -v valgrind >/dev/null || { echo "fastpath.sh: valgrind is not installed (make fastpath installs it)" >&2; exit 2; }
    command -v python3 >/dev/null || { echo "fastpath.sh: python3 is not installed (make installs it)" >&2; exit 2; }
    work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
    gcc -O2 -o "$work/probe" "$here/fastpath_bench.c"
    entries=()
    if [[ $# -eq 1 ]]; then
      lib=/usr/lib/x86_64-linux-gnu
      # qmalloc as it runs by default (the heap profiler sampling: its samples' share per pair), and
      # its fast paths alone.
      entries=("qmalloc=${1#*=}" "qmalloc-nosample=${1#*=},QMALLOC_PROF_SAMPLE=0" "system="
               "mimalloc=$lib/libmimalloc.so.2" "jemalloc=$lib/libjemalloc.so.2" "tcmalloc=$lib/libtcmalloc_minimal.so.4")
    else
      for arg in "$@"; do
        if [[ "$arg" == *=* ]]; then entries+=("$arg"); else entries+=("$(basename "$(dirname "$(realpath "${arg%%,*}")")")/$(basename "${arg%%,*}")=$arg"); fi
      done
    fi
    outs=()
    for entry in "${entries[@]}"; do
      name=${entry%%=*}; path=${entry#*=}; vars=()
      if [[ "$path" == *,* ]]; then IFS=, read -ra vars <<<"${path#*,}"; path=${path%%,*}; fi
      if [[ -n "$path" && ! -f "$path" ]]; then outs+=("$name="); continue; fi
      # LD_PRELOAD looks a name without a slash up in the library path, not here: make it absolute,
      # or a relative build/libqmalloc.so would silently measure glibc.
      [[ -z "$path" ]] || path=$(realpath "$path")
      out="$work/cg.${#outs[@]}"
      # Strings and positions uncompressed, so that the table below can read the file line by line.
      if ! env "${vars[@]}" ${path:+LD_PRELOAD=$path} valgrind --tool=callgrind --compress-strings=no --compress-pos=no \
             --callgrind-out-file="$out" "$work/probe" >"$work/log" 2>&1; then
        echo "fastpath.sh: the probe failed under $name:" >&2; tail -3 "$work/log" >&2; exit 1
      fi
      outs+=("$name=$out")
    done
    compare=$([[ $# -gt 1 ]] && echo yes || echo no)
    python3 - "$compare" "${outs[@]}" <<'PY'
# For every measure_PATTERN_SIZE function of the probe: the inclusive cost of its calls to the
# allocator's malloc and free (a callee whose name contains "free" is the free, one that contains
# "realloc" the realloc), minus the cost of the same calls from null_PATTERN_SIZE (empty
# functions), per pair; and per call for the two realloc probes.
import re, sys
PAIRS = 16384  # ROUNDS in fastpath_bench.c
SIZES = ["16", "32", "64", "128", "256", "512", "1024", "4096", "16384", "32768"]
PATTERNS = [("hot", "hot pair"), ("batch", "batch of 64"), ("empties", "page empties")]

def calls(path):
    cost = {}  # (caller, "malloc"|"free") -> instructions
    fn = cfn = None
    take = False
    with open(path) as f:
        for line in f:
            if line.startswith("fn="):
                fn = line[3:].strip()
            elif line.startswith("cfn="):
                cfn = line[4:].strip()
            elif line.startswith("calls="):
                take = True
            elif take:
                take = False
                m = re.match(r"^\S+\s+(\d+)", line)
                if m and fn and re.match(r"(measure|null)_", fn):
                    callee = cfn.lower()
                    key = (fn, "realloc" if "realloc" in callee else "free" if "free" in callee else
                           "memalign" if "memalign" in callee else "malloc")
                    cost[key] = cost.get(key, 0) + int(m.group(1))
    return cost

def per_pair(cost, pattern, size):
    """(malloc, free) instructions per pair, or None when the probe left no such function."""
    out = []
    for op in ("malloc", "free"):
        real = cost.get((f"measure_{pattern}_{size}", op))
        null = cost.get((f"null_{pattern}_{size}", op))
        if real is None or null is None:
            return None
        out.append((real - null) / PAIRS)
    return tuple(out)

def per_call(cost, probe, ops):
    """The instructions of calls `ops` per round in measure_PROBE, or None."""
    total = 0
    for op in ops:
        real, null = cost.get((f"measure_{probe}", op)), cost.get((f"null_{probe}", op))
        if real is None or null is None:
            return None
        total += real - null
    return total / PAIRS

def cell(v):
    if v is None:
        return "-"
    return f"{v[0] + v[1]:.1f} {v[0]:.0f}+{v[1]:.0f}"

runs = []
compare = sys.argv[1] == "yes"
for arg in sys.argv[2:]:
    name, _, path = arg.partition("=")
    runs.append((name, calls(path) if path else None))
labels = [s if int(s) < 1024 else f"{int(s) // 1024}K" for s in SIZES]
width = max(len(n) for n, _ in runs) + 14
print("instructions per malloc+free pair: total malloc+free (callgrind; the probe's loop subtracted)")
print(f"{'allocator / pattern':{width}}" + "".join(f"{l:>17}" for l in labels) + f"{'mixed 16-512':>16}")
base = None
for name, cost in runs:
    if cost is None:
        print(f"{name:{width}}not installed")
        continue
    for pattern, text in PATTERNS:
        row = [per_pair(cost, pattern, s) for s in SIZES]
        mixed = per_pair(cost, "mixed", "512") if pattern == "hot" else None
        print(f"{name + ' ' + text:{width}}" + "".join(f"{cell(v):>17}" for v in row) + f"{cell(mixed) if mixed else '':>16}")
    if base is None:
        base = (name, cost)
    elif compare:
        # Side by side builds: the change from the first, total per pair.
        for pattern, text in PATTERNS + [("mixed", "mixed")]:
            sizes = SIZES if pattern != "mixed" else ["512"]
            diffs = []
            for s in sizes:
                a, b = per_pair(base[1], pattern, s), per_pair(cost, pattern, s)
                diffs.append(f"{(b[0] + b[1]) - (a[0] + a[1]):+.1f}" if a and b else "-")
            if pattern == "mixed":
                print(f"{'  change ' + text:{width}}" + " " * 17 * len(SIZES) + f"{diffs[0]:>16}")
            else:
                print(f"{'  change ' + text:{width}}" + "".join(f"{d:>17}" for d in diffs))
print("mixed 16-512 (in each hot-pair row): one pair of every size from 16 to 512 in steps of 16.")
print()
print("instructions per realloc call, and per posix_memalign(64, 64) + free pair (the probe's loop subtracted)")
print(f"{'allocator':{width}}{'realloc in place':>20}{'realloc moving':>20}{'aligned 64 pair':>20}")
first = None
for name, cost in runs:
    if cost is None:
        continue
    v = [per_call(cost, "realloc_inplace", ["realloc"]), per_call(cost, "realloc_moving", ["realloc"]),
         per_call(cost, "aligned_64", ["memalign", "free"])]
    print(f"{name:{width}}" + "".join(f"{x:>20.1f}" if x is not None else f"{'-':>20}" for x in v))
    if first is None:
        first = v
    elif compare:
        d = [f"{b - a:+.1f}" if a is not None and b is not None else "-" for a, b in zip(first, v)]
        print(f"{'  change':{width}}" + "".join(f"{x:>20}" for x in d))
PY
    ;;
esac
