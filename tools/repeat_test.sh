#!/usr/bin/env bash
# Runs one CTest test of a build COUNT times in a row, as issue 11 asks of the fork tests ("pass 100
# runs in a row, and say how long that took"). Not part of `make test`: it is how flaky failures
# and rare hangs are hunted. Each run goes through ctest, so it gets the test's own command,
# environment and a timeout (a hang counts as a failure, it does not block). A failing run's
# output is kept in BUILD_DIR/repeat/NAME.RUN.log; the last line gives the passes, failures and
# the total time.
# usage: tools/repeat_test.sh NAME COUNT [BUILD_DIR] [TIMEOUT_SECONDS]   (build: build, timeout: 600)
# e.g.   tools/repeat_test.sh stress-fork 100
set -uo pipefail
name=${1:-} count=${2:-} dir=${3:-build} timeout=${4:-600}
if [[ -z $name || ! $count =~ ^[1-9][0-9]*$ || ! $timeout =~ ^[1-9][0-9]*$ ]]; then
  echo "repeat_test.sh: usage: repeat_test.sh NAME COUNT [BUILD_DIR] [TIMEOUT_SECONDS] (COUNT, TIMEOUT: positive integers)" >&2
  exit 2
fi
if [[ ! -f $dir/CTestTestfile.cmake ]]; then
  echo "repeat_test.sh: $dir is not a configured build directory (run make first)" >&2; exit 2
fi
if ! (cd "$dir" && ctest -N -R "^$name\$" | grep -q "Total Tests: 1$"); then
  echo "repeat_test.sh: no test named '$name' in $dir (ctest -N lists them)" >&2; exit 2
fi
mkdir -p "$dir/repeat"
log=$(cd "$dir/repeat" && pwd)
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; } # seconds since $1
failed=0 start=$EPOCHREALTIME
for ((run = 1; run <= count; run++)); do
  t0=$EPOCHREALTIME
  if (cd "$dir" && ctest -R "^$name\$" --output-on-failure --timeout "$timeout") >"$log/$name.$run.log" 2>&1; then
    rm -f "$log/$name.$run.log"
  else
    failed=$((failed + 1))
    echo "repeat_test.sh: $name run $run FAILED after $(since "$t0") s (output: $log/$name.$run.log)"
  fi
done
total=$(since "$start")
echo "$name: $count runs, $((count - failed)) passed, $failed failed, $total s in all" \
  "($(awk -v t="$total" -v n="$count" 'BEGIN { printf "%.2f", t / n }') s a run)"
[[ $failed -eq 0 ]]
