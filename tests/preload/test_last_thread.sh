#!/usr/bin/env bash
# A process ends when its last thread does, also when that thread ended with pthread_exit and
# qmalloc's background releaser runs (last_thread.c): with the default and the hardened library
# preloaded, the program whose main thread calls pthread_exit, and the child forked from a thread
# whose only thread returns, each end with status 0 and run their atexit handlers, having had a
# releaser thread. Before the releaser ended with the program's threads both hung (here: killed
# after 20 s, status 137). 20 s is far beyond the second or so they need; it is the hang's bound,
# not a timing. SIGKILL, as the hung process's only live thread, the releaser, blocks every other
# signal; output goes to files, since a hung child would hold a pipe open.
set -u
source "$(dirname "$0")/common.sh"
require_env QMALLOC_SO QM_HARDENED_SO QM_TEST_BIN
prog=$QM_TEST_BIN/preload_last_thread

for build in default hardened; do
  so=$(library_of $build)

  LD_PRELOAD=$so timeout -s KILL 20 "$prog" main >"$QM_TMP/$build.main.out" 2>"$QM_TMP/$build.main.err"
  st=$?
  out=$(cat "$QM_TMP/$build.main.out")
  if [[ $st -eq 0 && $out == *"releaser running"* && $out == *"atexit ran"* ]]; then
    pass "$build: main calls pthread_exit with the releaser running; the process ends (status 0, atexit ran)"
  else
    fail "$build: main calls pthread_exit: status $st (137: still running after 20 s), output: $(tr '\n' ' ' <<<"$out")"
  fi

  LD_PRELOAD=$so timeout -s KILL 20 "$prog" fork >"$QM_TMP/$build.fork.out" 2>"$QM_TMP/$build.fork.err"
  st=$?
  out=$(cat "$QM_TMP/$build.fork.out")
  if [[ $st -eq 0 && $out == *"releaser running"* && $out == *"atexit ran"* && $out == *"child status 0"* ]]; then
    pass "$build: a child forked from a thread ends when that thread returns (status 0, atexit ran)"
  else
    fail "$build: child forked from a thread: status $st (137: still running after 20 s), output: $(tr '\n' ' ' <<<"$out")"
  fi
done
finish
