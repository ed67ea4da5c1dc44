#!/usr/bin/env bash
# The checked builds of `make test` (CTest tests checked-debug and checked-tsan, on by default:
# CMake option QM_CHECKED_BUILDS): each configures a second build directory, builds only the library
# objects and the tests it runs, and runs them there. Sizes are cut to fit the budget (both
# together, builds included, about 4 minutes on 2 cores) through the arguments and variables the
# tests take; every test the issue names runs, none is skipped.
#   debug  QM_DEBUG=ON: every <module>_check() invariant on the slow paths; all unit tests, and all
#          stress tests at reduced sizes (8 threads x 3,000 operations, 600 short-lived threads, 12
#          forks, huge_realloc's --smoke).
#   tsan   ThreadSanitizer + UndefinedBehaviorSanitizer over the library's own code, without the
#          standard names (QM_STD_NAMES=OFF: the sanitizer runtime owns malloc), the tests calling
#          the qm_* entry points: multi-thread stress with remote frees (4 threads x 1,500
#          operations) and thread churn (160 threads) with no suppression at all, the same stress
#          with the heap profiler sampling every 64 bytes under a budget of 100 samples a second
#          (about 2,200 samples, the bucket and a few at stretched intervals: records, forgets, the
#          budget's bookkeeping and the stack walk from four threads), the same stress under
#          pressure (a 256 KiB total thread-cache budget, so that threads take budget from each
#          other, and a 1 MiB retain cap, so that frees wake the releaser: the steal's read of
#          another cache's capacity raced the owner's plain write in 6 runs of 6 before
#          tcache_set_capacity), then idle reclaim (unit-reclaim, its race at QM_TEST_RACE_OPS
#          operations a racer) and the thread-cache, central-list, page-heap, releaser (its
#          wake under the page heap's lock) and options-race (mallopt's sets against readers)
#          unit tests, and unit-release_unlocked (a span allocation while another thread is in the
#          madvise of a release, outside the lock). Any report fails the test (halt_on_error,
#          and -fno-sanitize-recover for UBSan). The stress tests run with idle reclaim off
#          (QMALLOC_TCACHE_IDLE_MS=0): its membarrier(2) protocol orders plain accesses in a way
#          ThreadSanitizer does not model (src/tcache.c, tcache_reclaim_scan, says why that is not a
#          race), so it is checked by unit-reclaim alone, with tests/tsan.supp naming those reports.
# A sanitizer runtime that is missing is installed by tools/deps.sh checked.
# usage: tools/checked_build.sh debug|tsan SOURCE_DIR BUILD_DIR
set -euo pipefail
kind=${1:-} src=${2:-} dir=${3:-}
if [[ -z $src || -z $dir || ! -f $src/CMakeLists.txt ]]; then
  echo "checked_build.sh: usage: checked_build.sh debug|tsan SOURCE_DIR BUILD_DIR" >&2; exit 2
fi
# Each run: "NAME ENV... -- PROGRAM ARGS...", PROGRAM a target of the build directory.
case $kind in
  debug)
    args=(-DQM_DEBUG=ON)
    unit_regex='^unit-'
    units=()
    for f in "$src"/tests/unit/test_*.c; do n=$(basename "$f" .c); units+=("unit_${n#test_}"); done
    stress=("stress-stress -- stress_stress --threads 8 --ops 3000"
            "stress-thread_churn -- stress_thread_churn --threads 600"
            "stress-huge_realloc -- stress_huge_realloc --smoke"
            "stress-fork -- stress_fork --forks 12") ;;
  tsan)
    args=(-DQM_STD_NAMES=OFF -DQM_SANITIZE=thread,undefined)
    unit_regex='^unit-(reclaim|tcache|central|pageheap|release|release_unlocked|options_race)$'
    units=(unit_reclaim unit_tcache unit_central unit_pageheap unit_release unit_release_unlocked unit_options_race)
    stress=("stress-stress QMALLOC_TCACHE_IDLE_MS=0 -- stress_stress --threads 4 --ops 1500"
            "stress-thread_churn QMALLOC_TCACHE_IDLE_MS=0 -- stress_thread_churn --threads 160"
            "stress-stress-sampled QMALLOC_TCACHE_IDLE_MS=0 QMALLOC_PROF_SAMPLE=64 QMALLOC_PROF_MAX_SAMPLES=100 QMALLOC_STATS=1 -- stress_stress --threads 4 --ops 1500"
            "stress-stress-pressure QMALLOC_TCACHE_IDLE_MS=0 QMALLOC_TCACHE_TOTAL=256K QMALLOC_RETAIN_MAX=1M -- stress_stress --threads 4 --ops 1500") ;;
  *) echo "checked_build.sh: unknown build '$kind' (expected debug or tsan)" >&2; exit 2 ;;
esac
[[ $kind == tsan ]] && { "$src/tools/deps.sh" checked || exit 1; }
targets=("${units[@]}")
for s in "${stress[@]}"; do p=${s#* -- }; targets+=("${p%% *}"); done

start=$SECONDS
mkdir -p "$dir"
cmake -S "$src" -B "$dir" -DQM_CHECKED_BUILDS=OFF "${args[@]}" >"$dir/configure.log" 2>&1 ||
  { tail -30 "$dir/configure.log"; echo "checked-$kind: cmake could not configure $dir" >&2; exit 1; }
cmake --build "$dir" -j 2 --target "${targets[@]}" >"$dir/build.log" 2>&1 ||
  { tail -30 "$dir/build.log"; echo "checked-$kind: the build failed (log: $dir/build.log)" >&2; exit 1; }
echo "checked-$kind: built ${#targets[@]} tests in $((SECONDS - start)) s"

export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"
tsan_plain="halt_on_error=1 history_size=7 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
cd "$dir"
failed=0
for s in "${stress[@]}"; do
  read -r -a head <<<"${s%% -- *}"
  read -r -a cmd <<<"${s#* -- }"
  t0=$SECONDS
  # The stress tests under ThreadSanitizer: no suppression file (nothing in them may be excused).
  if env TSAN_OPTIONS="$tsan_plain" "${head[@]:1}" timeout 600 "./${cmd[0]}" "${cmd[@]:1}" >"$dir/${head[0]}.log" 2>&1; then
    echo "checked-$kind: ${head[0]} (${cmd[*]:1}) passed in $((SECONDS - t0)) s"
  else
    st=$?
    failed=1
    tail -60 "$dir/${head[0]}.log"
    echo "checked-$kind: ${head[0]} (${cmd[*]:1}) FAILED with status $st (timeout 600 s: 124) in $((SECONDS - t0)) s"
  fi
done
# The sampled stress must have sampled, and stretched, or it checked nothing of the profiler.
if [[ $kind == tsan ]]; then
  log="$dir/stress-stress-sampled.log"
  taken=$(sed -n 's/^MALLOC: *\([0-9]*\) heap profiler: samples taken since start$/\1/p' "$log")
  stretched=$(sed -n 's/^MALLOC: *\([0-9]*\) heap profiler: samples drawn at an interval the sample budget stretched$/\1/p' "$log")
  if [[ ${taken:-0} -gt 0 && ${stretched:-0} -gt 0 ]]; then
    echo "checked-$kind: stress-stress-sampled took $taken samples, $stretched at stretched intervals"
  else
    failed=1
    echo "checked-$kind: stress-stress-sampled took '${taken}' samples, '${stretched}' stretched (expected some of both)"
  fi
fi
# The unit tests through ctest (their environment is CMake's); under ThreadSanitizer with the
# suppressions of the membarrier protocol, and unit-reclaim's race cut to 200,000 operations.
export TSAN_OPTIONS="$tsan_plain suppressions=$src/tests/tsan.supp"
[[ $kind == tsan ]] && export QM_TEST_RACE_OPS=${QM_TEST_RACE_OPS:-200000}
t0=$SECONDS
if ctest -R "$unit_regex" -j 2 --output-on-failure --timeout 600 >"$dir/unit.log" 2>&1; then
  echo "checked-$kind: $(grep -c 'Passed' "$dir/unit.log") unit tests passed in $((SECONDS - t0)) s"
else
  failed=1
  cat "$dir/unit.log"
  echo "checked-$kind: unit tests FAILED"
fi
echo "checked-$kind: $( ((failed)) && echo FAILED || echo passed) in $((SECONDS - start)) s in all"
exit $failed
