#!/usr/bin/env bash
# fork() beside libc's locks and from a signal handler, under LD_PRELOAD=$QMALLOC_SO (issue 11):
# tests/preload/fork_safety.c runs each scenario under its own watchdog, which kills it after 60 s
# and prints "hang" (each takes well under a second when nothing hangs):
#  - stdio: a fork storm beside getline on a 50,000-byte line and fflush(NULL);
#  - signal: fork from an interval timer's handler against a malloc/free/realloc loop;
#  - spawn: posix_spawn and vfork+exec while threads allocate.
# Each must print "<scenario>: ok (<n> forks)" and exit 0.
set -u
source "$(dirname "$0")/common.sh"
require_env QMALLOC_SO QM_TEST_BIN
PROG=$QM_TEST_BIN/preload_fork_safety
[[ -x $PROG ]] || { fail "missing test program $PROG"; finish; }

for scenario in stdio signal spawn; do
  LD_PRELOAD=$QMALLOC_SO "$PROG" "$scenario" "$QM_TMP" >"$QM_TMP/out" 2>"$QM_TMP/err"
  st=$?
  if [[ $st -eq 0 ]] && grep -q "^$scenario: ok" "$QM_TMP/out"; then
    pass "$(cat "$QM_TMP/out")"
  else
    fail "$scenario: exit status $st; stdout: $(tr '\n' ' ' <"$QM_TMP/out") stderr: $(head -3 "$QM_TMP/err" | tr '\n' ' ')"
  fi
done
finish
