#!/usr/bin/env bash
# glibc's other names for its allocator (__libc_malloc, __libc_free, __libc_calloc, __libc_realloc,
# __libc_memalign, __libc_valloc, __libc_pvalloc) and cfree, called by a plain program under
# LD_PRELOAD with the default and the hardened library: blocks cross between those names and the
# standard ones both ways with their contents intact; blocks from __libc_malloc and __libc_calloc
# show in the preloaded allocator's mallinfo2 (so qmalloc served them, not glibc); and a second
# __libc_free of a block stops with qmalloc's double-free line. Before qmalloc exported these
# names, the program died at its first cross: "free(): invalid pointer" from glibc, or
# "qmalloc: free(): invalid pointer" from qmalloc.
set -u
source "$(dirname "$0")/common.sh"
require_env QMALLOC_SO QM_HARDENED_SO QM_TEST_BIN
prog=$QM_TEST_BIN/preload_libc_names

for build in default hardened; do
  so=$(library_of $build)

  out=$(LD_PRELOAD=$so "$prog" mix 2>"$QM_TMP/$build.err")
  st=$?
  if [[ $st -eq 0 && $out == *"mix OK"* ]]; then
    pass "$build: blocks cross between the __libc_ names, cfree and the standard names"
  else
    fail "$build: mix: status $st, output: $out"
    head -5 "$QM_TMP/$build.err" | sed 's/^/    | /'
  fi
  counted=$(sed -n 's/^counted //p' <<<"$out")
  if [[ ${counted:-0} -ge 1000000 ]]; then
    pass "$build: mallinfo2 counts the 1,000 x 1,000 bytes from __libc_malloc and __libc_calloc ($counted)"
  else
    fail "$build: mallinfo2 counts ${counted:-nothing} bytes in use, not the 1,000,000 held from __libc_malloc and __libc_calloc"
  fi

  out=$(LD_PRELOAD=$so "$prog" twice 2>"$QM_TMP/$build.twice")
  st=$?
  block=$(sed -n 's/^block //p' <<<"$out")
  line=$(grep '^qmalloc: ' "$QM_TMP/$build.twice" | head -1)
  if [[ $st -ne 0 && -n $block && $line == "qmalloc: free(): double free $block" && $out != *survived* ]]; then
    pass "$build: a second __libc_free stops with '$line'"
  else
    fail "$build: second __libc_free of $block: status $st, stderr: $(head -2 "$QM_TMP/$build.twice" | tr '\n' ' ')"
  fi
done
finish
