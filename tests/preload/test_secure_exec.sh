#!/usr/bin/env bash
# Secure execution (set-user-ID programs): a program linked with libqmalloc.a reads QMALLOC_
# variables when run as it is, and none when it runs set-user-ID to another user. The variables:
# QMALLOC_PROF_DUMP (profiles written at exit to a path of the caller's choosing, a file any user
# could otherwise have a set-user-ID program create or truncate with its privileges), with
# QMALLOC_PROF_SAMPLE=1 so that there is something to write, and QMALLOC_VERBOSE and
# QMALLOC_STATS (lines on stderr). The control run shows the same binary honours them, so each
# check can fail. Making the set-user-ID copy needs root (chown to another user); without it the
# test says so and exits 77 (skipped).
set -u
source "$(dirname "$0")/common.sh"
require_env QMALLOC_STATIC_LIB QM_SOURCE_DIR QM_BUILD_DIR
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIP: making a set-user-ID binary owned by another user needs root"
  exit 77
fi
chmod 0711 "$QM_TMP" # the set-user-ID run (as nobody) must reach its output directory
prog=$QM_TMP/secure_prog
if ! gcc -O1 -o "$prog" "$QM_SOURCE_DIR/tests/preload/static/secure_prog.c" "$QMALLOC_STATIC_LIB" -lpthread 2>"$QM_TMP/link.err"; then
  fail "secure_prog does not link with libqmalloc.a:"; head -10 "$QM_TMP/link.err" | sed 's/^/    | /'; finish
fi
mkdir -m 1777 "$QM_TMP/out-plain" "$QM_TMP/out-setuid"

run() { # run LABEL BINARY OUTDIR: the binary with the variables set; stdout and stderr kept
  QMALLOC_PROF_DUMP=$3/profile QMALLOC_PROF_SAMPLE=1 QMALLOC_VERBOSE=1 QMALLOC_STATS=1 \
    "$2" >"$QM_TMP/$1.out" 2>"$QM_TMP/$1.err"
}

run plain "$prog" "$QM_TMP/out-plain"
dumps=$(ls "$QM_TMP/out-plain" | wc -l)
if grep -q '^uid 0 euid 0$' "$QM_TMP/plain.out" && [[ $dumps -ge 3 ]] &&
   grep -q '^qmalloc: option prof_dump' "$QM_TMP/plain.err" && grep -q 'bytes mapped from the OS' "$QM_TMP/plain.err"; then
  pass "control: run as it is, the program writes $dumps profiles, the options and the statistics"
else
  fail "control: the variables had no effect on the program run as it is (profiles: $dumps; stdout: $(head -1 "$QM_TMP/plain.out"))"
fi

# The set-user-ID copy goes where the mount honours the bit: the scratch directory, else the
# build tree (some systems mount /tmp nosuid); where neither does, nothing here can test it.
setuid_dir=
for dir in "$QM_TMP" "$QM_BUILD_DIR"; do
  if ! findmnt -n -o OPTIONS -T "$dir" | tr ',' '\n' | grep -qx nosuid; then setuid_dir=$dir; break; fi
done
if [[ -z $setuid_dir ]]; then
  echo "SKIP: $QM_TMP and $QM_BUILD_DIR are both on nosuid mounts"
  exit 77
fi
setuid_prog=$setuid_dir/secure_prog-setuid.$$
trap 'rm -rf "$QM_TMP" "$setuid_prog"' EXIT
cp "$prog" "$setuid_prog"
chown nobody "$setuid_prog" && chmod 4755 "$setuid_prog"
run setuid "$setuid_prog" "$QM_TMP/out-setuid"
st=$?
nobody=$(id -u nobody)
if [[ $st -eq 0 ]] && grep -q "^uid 0 euid $nobody\$" "$QM_TMP/setuid.out"; then
  pass "the set-user-ID copy runs as user nobody (uid 0 euid $nobody): secure execution"
else
  fail "the set-user-ID copy $setuid_prog did not run set-user-ID (status $st, stdout: $(head -1 "$QM_TMP/setuid.out"))"
fi
if [[ -z $(ls "$QM_TMP/out-setuid") ]]; then
  pass "set-user-ID: QMALLOC_PROF_DUMP is ignored (no file written)"
else
  fail "set-user-ID: QMALLOC_PROF_DUMP was followed: $(ls "$QM_TMP/out-setuid" | tr '\n' ' ')"
fi
if ! grep -q '^qmalloc: option' "$QM_TMP/setuid.err" && ! grep -q 'bytes mapped from the OS' "$QM_TMP/setuid.err"; then
  pass "set-user-ID: QMALLOC_VERBOSE and QMALLOC_STATS are ignored (nothing on stderr)"
else
  fail "set-user-ID: qmalloc wrote to stderr: $(head -2 "$QM_TMP/setuid.err" | tr '\n' ' ')"
fi
finish
