#!/usr/bin/env bash
# The background releaser is never started by a free the dynamic loader makes (src/release.c):
# glibc frees a dlopen'd module's TLS blocks from ld.so under the lock of its stack cache, which
# pthread_create takes too (releaser_tls.c). With the default and the hardened library preloaded the program must end
# with status 0 and print "done"; before the fix the default build hung there every time (here:
# killed after 30 s, status 137; it needs well under a second: 30 s bounds the hang, it is not a
# timing). Preloaded, not linked: linked to libqmalloc, the same program did not hang before the
# fix either. api-releaser_start has the forked-child case.
set -u
source "$(dirname "$0")/common.sh"
require_env QMALLOC_SO QM_HARDENED_SO QM_TEST_BIN
prog=$QM_TEST_BIN/preload_releaser_tls

for build in default hardened; do
  so=$(library_of $build)
  LD_PRELOAD=$so timeout -s KILL 30 "$prog" >"$QM_TMP/$build.out" 2>"$QM_TMP/$build.err"
  st=$?
  if [[ $st -eq 0 ]] && grep -qx done "$QM_TMP/$build.out"; then
    pass "$build: threads' dlopen'd TLS freed by glibc under its stack-cache lock; the program ends (status 0)"
  else
    fail "$build: status $st (137: still running after 30 s), output: $(tr '\n' ' ' <"$QM_TMP/$build.out") $(head -3 "$QM_TMP/$build.err")"
  fi
done
finish
