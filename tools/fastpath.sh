#!/usr/bin/env bash
# Fast-path measurements.
#   tools/fastpath.sh count [QMALLOC_SO]  instructions per malloc+free pair (sizes 16..512) under
#                                         callgrind, for qmalloc and every installed peer
#   tools/fastpath.sh asm [QMALLOC_SO]    disassembly of qm_malloc and qm_free
# Instruction counts are repeatable (callgrind counts, it does not time), so they can be compared
# across runs and machines of one architecture; docs/fastpath.md keeps the current figures.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=${1:-count}
so=${2:-$here/../build/libqmalloc.so}
[[ -f "$so" ]] || { echo "fastpath.sh: $so not found (run make first)" >&2; exit 2; }
case "$mode" in
  asm)
    for fn in qm_malloc qm_free; do
      echo "== $fn"
      gdb -batch -ex "disassemble $fn" "$so" 2>/dev/null | grep -v '^End\|^Dump' ||
        objdump -d --no-show-raw-insn "$so" | awk -v f="<$fn>:" '$2==f{p=1} p&&/^$/{exit} p'
    done ;;
  count)
    command -v valgrind >/dev/null || { echo "fastpath.sh: valgrind is not installed (make fastpath installs it)" >&2; exit 2; }
    work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
    gcc -O2 -o "$work/probe" "$here/fastpath_bench.c"
    ir() { # ir LD_PRELOAD ARGS...
      local pre=$1; shift
      env ${pre:+LD_PRELOAD=$pre} valgrind --tool=callgrind --toggle-collect=measured_loop \
        --callgrind-out-file="$work/cg.out" "$work/probe" "$@" >/dev/null 2>&1
      callgrind_annotate "$work/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1); v=$1} END{print v}'
    }
    pairs=$((2000 * 32))
    null=$(ir "" null)
    printf "%-10s %10s   (loop overhead %.1f instructions subtracted; sizes 16..512)\n" allocator "instr/pair" "$(echo "$null / $pairs" | bc -l)"
    lib=/usr/lib/x86_64-linux-gnu
    for entry in "qmalloc=$so" "system=" "mimalloc=$lib/libmimalloc.so.2" "jemalloc=$lib/libjemalloc.so.2" "tcmalloc=$lib/libtcmalloc_minimal.so.4"; do
      name=${entry%%=*}; path=${entry#*=}
      if [[ -n "$path" && ! -f "$path" ]]; then printf "%-10s %10s\n" "$name" "not installed"; continue; fi
      total=$(ir "$path")
      printf "%-10s %10.1f\n" "$name" "$(echo "($total - $null) / $pairs" | bc -l)"
    done ;;
  *) echo "usage: tools/fastpath.sh count|asm [path/to/libqmalloc.so]" >&2; exit 2 ;;
esac
