#!/usr/bin/env bash
# The checked builds of `make test` (CTest tests checked-debug and checked-tsan): each configures a
# second build directory, builds only the tests it runs, and runs them there.
#   debug  QM_DEBUG=ON: every <module>_check() invariant on the slow paths; all unit and stress
#          tests.
#   tsan   ThreadSanitizer + UndefinedBehaviorSanitizer over the library's own code, without the
#          standard names (QM_STD_NAMES=OFF: the sanitizer runtime owns malloc), the tests calling
#          the qm_* entry points: multi-thread stress with remote frees, thread churn, idle reclaim
#          and the thread-cache, central-list and page-heap unit tests. Any report fails the test
#          (halt_on_error). The stress tests run with idle reclaim off (QMALLOC_TCACHE_IDLE_MS=0):
#          its membarrier(2) protocol orders plain accesses in a way ThreadSanitizer does not
#          model, so it is checked by unit-reclaim alone, with tests/tsan.supp listing those
#          reports and why each is not a race; the stress tests run with no suppression at all.
# usage: tools/checked_build.sh debug|tsan SOURCE_DIR BUILD_DIR
set -euo pipefail
kind=${1:-} src=${2:-} dir=${3:-}
if [[ -z $src || -z $dir || ! -f $src/CMakeLists.txt ]]; then
  echo "checked_build.sh: usage: checked_build.sh debug|tsan SOURCE_DIR BUILD_DIR" >&2; exit 2
fi
case $kind in
  debug)
    args=(-DQM_DEBUG=ON)
    tests=()
    for f in "$src"/tests/unit/test_*.c "$src"/tests/stress/test_*.c; do
      d=$(basename "$(dirname "$f")"); n=$(basename "$f" .c); tests+=("$d-${n#test_}")
    done ;;
  tsan)
    args=(-DQM_STD_NAMES=OFF -DQM_SANITIZE=thread,undefined)
    tests=(stress-stress stress-thread_churn unit-reclaim unit-tcache unit-central unit-pageheap) ;;
  *) echo "checked_build.sh: unknown build '$kind' (expected debug or tsan)" >&2; exit 2 ;;
esac
targets=()
for t in "${tests[@]}"; do targets+=("${t/-/_}"); done
regex="^($(IFS='|'; echo "${tests[*]}"))\$"

cmake -S "$src" -B "$dir" -DQM_CHECKED_BUILDS=OFF "${args[@]}" >/dev/null
cmake --build "$dir" -j 2 --target "${targets[@]}" >"$dir/build.log" 2>&1 || { tail -30 "$dir/build.log"; exit 1; }
export TSAN_OPTIONS="halt_on_error=1 history_size=7 second_deadlock_stack=1 suppressions=$src/tests/tsan.supp ${TSAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"
cd "$dir"
echo "checked-$kind: ${tests[*]}"
if [[ $kind == tsan ]]; then
  QMALLOC_TCACHE_IDLE_MS=0 TSAN_OPTIONS="halt_on_error=1 history_size=7" \
    ctest -R '^stress-(stress|thread_churn)$' --output-on-failure --timeout 600 || exit 1
  regex='^unit-'
fi
ctest -R "$regex" --output-on-failure --timeout 600
