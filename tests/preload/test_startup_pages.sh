#!/usr/bin/env bash
# What loading and starting qmalloc costs every process, in pages (docs/design.md, "What a process
# pays at start"): the small globals written at start are in the library's .data, and that .data
# is one page; and a program that makes one allocation (startup_pages.c) takes at most
# QM_STARTUP_EXTRA_MAX more minor page faults with the default or the hardened library preloaded
# than with glibc's malloc, medians of 5 runs each. 22-24 (default) and 24-26 (hardened) on Debian
# 12 (x86-64) at the commit that added this test, also with other tests running, and 34 and 36
# before it (what is left: the loader's work for a second library, qmalloc's first spans, thread
# cache and page-map leaf; before, also a dozen pages of .bss, central lists and option strings
# touched at start). Page faults, not time: a slow machine takes as many.
set -u
source "$(dirname "$0")/common.sh"
require_env QMALLOC_SO QM_HARDENED_SO QM_TEST_BIN
prog=$QM_TEST_BIN/preload_startup_pages
QM_STARTUP_EXTRA_MAX=32

# median_faults [LIB]: the median of 5 runs' fault counts, with LIB preloaded if given.
median_faults() {
  local i
  for i in 1 2 3 4 5; do
    if [[ -n ${1:-} ]]; then LD_PRELOAD=$1 "$prog"; else "$prog"; fi
  done | sort -n | sed -n 3p
}

for build in default hardened; do
  so=$(library_of $build)
  # .data on one page: its first and last byte's page numbers (readelf: address, then size).
  read -r start size < <(readelf -SW "$so" | awk '$2 == ".data" { print $4, $6 }')
  if [[ -n ${start:-} ]] && (( 0x$start / 4096 == (0x$start + 0x$size - 1) / 4096 )); then
    pass "$build: .data ($((0x$size)) bytes at 0x$start) is on one page"
  else
    fail "$build: .data (0x${size:-?} bytes at 0x${start:-?}) spans more than one page: QM_EARLY_DATA holds too much"
  fi
  # The globals every process writes at start, and those the heap profiler's first sample writes
  # (most processes take one), are there, not in .bss (nm: d = initialized data).
  for sym in init_done freelist_secret tcache_registry central_transfer_max sizeclass_batch prof_lock prof_budget unwind_load_lock; do
    kind=$(nm "$so" | awk -v s="$sym" '$3 == s { print $2 }')
    if [[ $kind == [dD] ]]; then pass "$build: $sym is in .data"; else fail "$build: $sym is '$kind' in nm, not .data (d)"; fi
  done
done

glibc=$(median_faults)
for build in default hardened; do
  so=$(library_of $build)
  with=$(median_faults "$so")
  if [[ $glibc =~ ^[0-9]+$ && $with =~ ^[0-9]+$ ]] && (( with - glibc <= QM_STARTUP_EXTRA_MAX )); then
    pass "$build: one allocation costs $with page faults, $((with - glibc)) over glibc's $glibc (at most $QM_STARTUP_EXTRA_MAX)"
  else
    fail "$build: one allocation costs '$with' page faults against glibc's '$glibc': more than $QM_STARTUP_EXTRA_MAX over"
  fi
done
finish
