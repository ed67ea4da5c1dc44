#!/usr/bin/env bash
# Static linking: tests/preload/static/static_prog.c linked with $QMALLOC_STATIC_LIB (libqmalloc.a)
#  (a) against the shared libc: `gcc prog.c libqmalloc.a -lpthread`;
#  (b) fully static: `gcc -static prog.c libqmalloc.a -lpthread` (if glibc's own malloc in libc.a
#      collides with qmalloc's, the linker's error is the FAIL message, verbatim).
# For each: it links; `nm` shows malloc and qm_malloc defined in the executable itself; it runs and
# prints "static_prog: OK" (the program cross-frees between malloc/free and qm_*, and frees libc's
# strdup result with qm_free, which only works if every malloc in the process is qmalloc's); and
# with QMALLOC_STATS=1 it leaves qmalloc's report with "bytes mapped from the OS" > 0.
set -u
source "$(dirname "$0")/common.sh"
require_env QMALLOC_STATIC_LIB QM_SOURCE_DIR QM_BUILD_DIR
SRC=$QM_SOURCE_DIR/tests/preload/static/static_prog.c

check_binary() { # check_binary NAME EXE
  local name=$1 exe=$2 syms out st
  syms=$(nm "$exe" 2>/dev/null)
  if grep -qE ' T malloc$' <<<"$syms" && grep -qE ' T qm_malloc$' <<<"$syms"; then
    pass "$name: malloc and qm_malloc are defined in the executable"
  else
    fail "$name: nm does not show malloc and qm_malloc defined (T) in the executable"
  fi
  out=$("$exe" 2>"$QM_TMP/$name.err")
  st=$?
  if [[ $st -eq 0 && $out == "static_prog: OK" ]]; then pass "$name: runs, malloc/free and qm_* are one heap, libc's strdup is served by qmalloc"
  else fail "$name: status $st, output: $out"; head -5 "$QM_TMP/$name.err" | sed 's/^/    | /'; fi
  QMALLOC_STATS=1 "$exe" >/dev/null 2>"$QM_TMP/$name.stats"
  check_stats "$name" "$QM_TMP/$name.stats" 1
}

# (a) static qmalloc, shared libc
if gcc -O1 -I"$QM_SOURCE_DIR/include" -I"$QM_BUILD_DIR/include" -o "$QM_TMP/prog_dyn" "$SRC" "$QMALLOC_STATIC_LIB" -lpthread 2>"$QM_TMP/link_dyn.err"; then
  pass "static qmalloc + shared libc: links"
  check_binary static-qmalloc "$QM_TMP/prog_dyn"
else
  fail "static qmalloc + shared libc: link failed:"; head -20 "$QM_TMP/link_dyn.err" | sed 's/^/    | /'
fi

# (b) fully static
if gcc -static -O1 -I"$QM_SOURCE_DIR/include" -I"$QM_BUILD_DIR/include" -o "$QM_TMP/prog_static" "$SRC" "$QMALLOC_STATIC_LIB" -lpthread 2>"$QM_TMP/link_static.err"; then
  pass "gcc -static: links"
  if [[ -s $QM_TMP/link_static.err ]]; then echo "INFO linker warnings:"; head -5 "$QM_TMP/link_static.err" | sed 's/^/    | /'; fi
  check_binary fully-static "$QM_TMP/prog_static"
else
  fail "gcc -static: link failed (exact linker error below):"; head -20 "$QM_TMP/link_static.err" | sed 's/^/    | /'
fi

finish
