#!/usr/bin/env bash
# qmalloc on aarch64: builds the library and its unit, API and stress tests with Debian's cross
# compiler (cmake/toolchain-aarch64-linux-gnu.cmake) in a build directory of its own, and runs each
# test under qemu-user; then the death tests (tests/preload/test_death.sh) with the aarch64 default
# and hardened libraries preloaded into the guest, which run the hardened build's checks in their
# portable form (harden.h: not SSE2). Fails if any test fails. It does not run the other preload
# and mtbench tests (they drive host tools: python, LD_PRELOAD of host programs).
# Installs gcc/g++-aarch64-linux-gnu, qemu-user and the arm64 libc when missing (as root); exits 77
# (CTest: skipped) with the reason printed only where they cannot be installed.
# Registered in CTest as cross-aarch64 (CMakeLists.txt), so `make test` runs it.
#
# usage: tests/cross/run.sh [BUILD_DIR]      (default: build-aarch64 beside the sources)
# Environment: QEMU_PAGESIZE=65536 runs the guest with 64 KiB pages (qemu's -p); JOBS (default 2).
set -uo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$src/build-aarch64}
jobs=${JOBS:-2}
sysroot=/usr/aarch64-linux-gnu
qemu=qemu-aarch64
say() { echo "cross-aarch64: $*"; }

# ---- the tools --------------------------------------------------------------------------------
missing=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || missing+=(g++-aarch64-linux-gnu)
[[ -e $sysroot/lib/libc.so.6 && -e $sysroot/include/stdio.h ]] || missing+=(libc6-dev-arm64-cross)
command -v $qemu >/dev/null 2>&1 || command -v qemu-aarch64-static >/dev/null 2>&1 || missing+=(qemu-user)
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    say "skipped: missing ${missing[*]} and cannot install them (needs root and apt-get)"; exit 77
  fi
  say "installing ${missing[*]}"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >/dev/null 2>&1; then
    say "skipped: apt-get could not install ${missing[*]}"; exit 77
  fi
fi
command -v $qemu >/dev/null 2>&1 || qemu=qemu-aarch64-static
qemu=$(command -v $qemu)

# ---- build ------------------------------------------------------------------------------------
tests=()
for f in "$src"/tests/unit/test_*.c "$src"/tests/api/test_*.c "$src"/tests/api/test_*.cc "$src"/tests/stress/test_*.c; do
  kind=$(basename "$(dirname "$f")") name=$(basename "${f%.*}")
  tests+=("${kind}_${name#test_}")
done
started=$SECONDS
mkdir -p "$build"
if ! cmake -S "$src" -B "$build" -DCMAKE_TOOLCHAIN_FILE="$src/cmake/toolchain-aarch64-linux-gnu.cmake" \
     >"$build/configure.log" 2>&1; then
  cat "$build/configure.log"; say "FAIL: cmake could not configure the aarch64 build"; exit 1
fi
if ! cmake --build "$build" -j "$jobs" --target "${tests[@]}" qmalloc_hardened preload_bad_free >"$build/build.log" 2>&1; then
  tail -40 "$build/build.log"; say "FAIL: the aarch64 build failed (log: $build/build.log)"; exit 1
fi
readelf -h "$build/libqmalloc.so" 2>/dev/null | grep -q 'Machine: *AArch64' ||
  { say "FAIL: $build/libqmalloc.so is not an aarch64 library"; exit 1; }
say "built ${#tests[@]} tests for aarch64 in $((SECONDS - started)) s ($build)"

# ---- what the emulator can do -----------------------------------------------------------------
# Its own probe, linked with the C library's malloc only: a thread started in a child forked from
# a threaded process (Debian 12's qemu 7.2 aborts there, qmalloc or not).
fork_args=()
aarch64-linux-gnu-gcc -O1 -pthread "$src/tests/cross/fork_thread_probe.c" -o "$build/fork_thread_probe" || exit 1
if ! (ulimit -c 0; "$qemu" -cpu max,sve=off -L $sysroot "$build/fork_thread_probe") >/dev/null 2>&1; then
  fork_args=(--no-child-threads)
  say "note: $qemu cannot start a thread in a child forked from a threaded process" \
      "(tests/cross/fork_thread_probe.c fails without qmalloc): stress-fork runs without its mode 1," \
      "and qmalloc's background releaser thread is off (QMALLOC_RELEASE_THREAD=0: a forked child would" \
      "start its own); api-idle_release, which needs it, says it cannot run"
  export QMALLOC_RELEASE_THREAD=0
fi

# ---- run --------------------------------------------------------------------------------------
# Sizes for a 10-30 times slower machine: the same checks, fewer rounds.
declare -A args=(
  [stress_stress]="--threads 8 --ops 3000"
  [stress_thread_churn]="--threads 400"
  [stress_fork]="--forks 16 ${fork_args[*]}"
  [stress_huge_realloc]="--rounds 60"
  [stress_take_race]="--smoke"
)
export QMALLOC_SO=$build/libqmalloc.so QM_SOURCE_DIR=$src QM_TEST_CHURN_MIB=128
# -cpu: qemu's default "max" CPU has SVE, and glibc's SVE memset/memcpy are emulated one element
# at a time (api-malloc_free: 72 s of CPU with it, 24 s without).
export QM_TEST_EMULATOR="$qemu -cpu max,sve=off -L $sysroot"
ulimit -c 0 # qemu writes a core file, and a line into the test's stderr, for every abort
say "running under $($qemu --version | head -1), guest page size ${QEMU_PAGESIZE:-4096, the default}"
passed=() failed=() skipped=()
run_started=$SECONDS
# $jobs tests at a time (the longest first, so the run ends soon after them); each one's output
# and exit status go to $build/results, read back in the order of the list.
mkdir -p "$build/results"
rm -f "$build"/results/*
run_one() { # run_one TEST
  local t0=$SECONDS
  local -a envs=()
  # As CMakeLists.txt does: the white-box tests count objects exactly, and a sampled allocation is
  # whole pages instead; unit-options checks the environment itself, unit-prof sets its own rates.
  if [[ $1 == unit_* && $1 != unit_options && $1 != unit_prof ]]; then envs=(QMALLOC_PROF_SAMPLE=0); fi
  # shellcheck disable=SC2086 # the arguments are words
  (cd "$build" && env "${envs[@]}" timeout 600 $QM_TEST_EMULATOR "./$1" ${args[$1]:-}) >"$build/results/$1.out" 2>&1
  echo "$? $((SECONDS - t0))" >"$build/results/$1.rc"
}
longest_first=(api_malloc_free stress_stress stress_fork api_huge_sizes api_aligned)
for t in "${longest_first[@]}" "${tests[@]}"; do
  [[ " ${tests[*]} " == *" $t "* && ! -e $build/results/$t.started ]] || continue
  touch "$build/results/$t.started"
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
  run_one "$t" &
done
wait
for t in "${tests[@]}"; do
  read -r rc secs <"$build/results/$t.rc"
  out=$(cat "$build/results/$t.out")
  name=${t/_/-}
  if ((rc == 0)); then
    passed+=("$name"); say "ok   $name ($secs s) ${args[$t]:-}"
    printf '%s\n' "$out" | grep -E 'note:|not run:' | sed 's/^/    /' # what could not be checked here
  elif ((rc == 77)); then # the test printed why it cannot run here
    skipped+=("$name"); say "skip $name: $(printf '%s\n' "$out" | grep -m1 'skipped:' | sed 's/.*skipped: //')"
  else
    failed+=("$name"); say "FAIL $name (exit $rc, $secs s) ${args[$t]:-}"
    printf '%s\n' "$out" | tail -40 | sed 's/^/    /'
  fi
done
death_started=$SECONDS
if QMALLOC_SO=$build/libqmalloc.so QM_HARDENED_SO=$build/libqmalloc-hardened.so QM_TEST_BIN=$build/tests/preload \
   bash "$src/tests/preload/test_death.sh" >"$build/results/death.out" 2>&1; then
  passed+=(preload-death); say "ok   preload-death ($((SECONDS - death_started)) s): $(tail -1 "$build/results/death.out")"
else
  failed+=(preload-death); say "FAIL preload-death ($((SECONDS - death_started)) s)"
  grep -v '^PASS' "$build/results/death.out" | tail -40 | sed 's/^/    /'
fi
say "emulated run: ${#tests[@]} tests and the death tests in $((SECONDS - run_started)) s ($jobs at a time)"
((${#failed[@]} == 0)) || say "failed: ${failed[*]}"
echo "cross-aarch64: ${#passed[@]} passed, ${#failed[@]} failed, ${#skipped[@]} skipped"
((${#failed[@]} == 0))
