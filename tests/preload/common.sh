# Shared by the tests/preload/test_*.sh scripts (sourced, not run by CTest): PASS/FAIL bookkeeping,
# the closing "N passed, N failed" line and exit code, the checks of the environment CTest passes
# in (QMALLOC_SO, QMALLOC_STATIC_LIB, QM_TEST_BIN, QM_SOURCE_DIR, QM_BUILD_DIR), a scratch
# directory removed on exit, the library of each build (library_of), and the parser of qmalloc's
# QMALLOC_STATS=1 report.

QM_PASSED=0
QM_FAILED=0

pass() { echo "PASS $*"; QM_PASSED=$((QM_PASSED + 1)); }
fail() { echo "FAIL $*"; QM_FAILED=$((QM_FAILED + 1)); }

# finish: the summary line; exit status 0 only if something ran and nothing failed.
finish() {
  echo "$QM_PASSED passed, $QM_FAILED failed"
  [[ $QM_FAILED -eq 0 && $QM_PASSED -gt 0 ]]
  exit $?
}

# require_env VAR...: each must be set (and, for paths, exist), else one FAIL line and stop.
require_env() {
  local v
  for v in "$@"; do
    if [[ -z ${!v:-} ]]; then
      fail "environment: $v is not set (ctest sets it; run through 'make test')"
      finish
    fi
    if [[ $v != QM_BUILD_DIR && ! -e ${!v} ]]; then
      fail "environment: $v=${!v} does not exist"
      finish
    fi
  done
}

QM_TMP=$(mktemp -d "${TMPDIR:-/tmp}/qm_preload.XXXXXX")
trap 'rm -rf "$QM_TMP"' EXIT
ulimit -c 0 # the death tests abort on purpose: no core files

# library_of BUILD: the preloaded library of the "default" or the "hardened" build.
library_of() { if [[ $1 == hardened ]]; then echo "$QM_HARDENED_SO"; else echo "$QMALLOC_SO"; fi; }

# stats_mapped FILE: the byte counts of every "MALLOC: = <n> (<m> MiB) bytes mapped from the OS"
# line in FILE (qmalloc writes its statistics to stderr at exit when QMALLOC_STATS=1; the format is
# docs/stats.md's: the total of the accounting identity carries "=", the terms "+"), one per line.
stats_mapped() {
  sed -nE 's/^MALLOC: *[=+]? *([0-9]+) .*mapped from the OS.*/\1/p' "$1"
}

# check_stats WHAT FILE MIN_LINES: at least MIN_LINES statistics lines, each with a count > 0.
check_stats() {
  local what=$1 file=$2 min=$3 n zero
  n=$(stats_mapped "$file" | wc -l)
  zero=$(stats_mapped "$file" | awk '$1 == 0' | wc -l)
  if [[ $n -ge $min && $zero -eq 0 ]]; then
    pass "$what: qmalloc served it ($n QMALLOC_STATS report(s), bytes mapped: $(stats_mapped "$file" | tr '\n' ' '))"
  else
    fail "$what: expected >= $min 'MALLOC: = <n> ... mapped from the OS' lines with n > 0 on stderr under QMALLOC_STATS=1, found $n ($zero with n = 0)"
  fi
}
