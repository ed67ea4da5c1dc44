#!/usr/bin/env bash
# The property test of issue 12: tests/preload/free_property.c runs random malloc/calloc/realloc/
# free sequences from four threads (remote frees included, small, medium and large blocks) and
# injects one double or invalid free at a random moment (the kind and the moment from the seed).
# For every seed, under the default library and the hardened one, the program must die by SIGABRT
# with exactly one line on stderr naming the call and the very address it injected:
#     qmalloc: free(): double free 0x...     (or "invalid pointer"; realloc() for realloc)
# and must never find a block with two owners (the stamps it checks before each free) nor
# survive the mistake.
set -u
source "$(dirname "$0")/common.sh"
require_env QMALLOC_SO QM_HARDENED_SO QM_TEST_BIN
PROG=$QM_TEST_BIN/preload_free_property
[[ -x $PROG ]] || { fail "missing test program $PROG"; finish; }
SEEDS=${QM_PROPERTY_SEEDS:-48}

for build in default hardened; do
  so=$(library_of $build)
  declare -A stopped=()
  bad=0
  for ((seed = 1; seed <= SEEDS; seed++)); do
    { LD_PRELOAD=$so "$PROG" "$seed" >"$QM_TMP/out" 2>"$QM_TMP/err"; } 2>/dev/null
    status=$?
    read -r _ kind addr _ < <(grep '^inject ' "$QM_TMP/out")
    line=$(head -n1 "$QM_TMP/err")
    lines=$(grep -c '' "$QM_TMP/err")
    what="$build seed $seed (${kind:-no injection} ${addr:-})"
    if grep -q '^two owners' "$QM_TMP/out"; then
      fail "$what: $(grep '^two owners' "$QM_TMP/out")"; bad=$((bad + 1)); continue
    fi
    if grep -q '^survived' "$QM_TMP/out"; then
      fail "$what: the mistake was not stopped (exit $status)"; bad=$((bad + 1)); continue
    fi
    if [[ $status -ne 134 || $lines -ne 1 ]]; then
      fail "$what: exit $status with $lines lines on stderr, expected SIGABRT (134) and one line:"
      sed 's/^/    | /' "$QM_TMP/err" | head -5; bad=$((bad + 1)); continue
    fi
    if ! [[ $line =~ ^qmalloc:\ (free|realloc)\(\):\ (double\ free|invalid\ pointer)\ (0x[0-9a-f]+)$ && ${BASH_REMATCH[3]} == "$addr" ]]; then
      fail "$what: stderr line '$line' does not name the injected call's address $addr"; bad=$((bad + 1)); continue
    fi
    stopped[$kind]=$((${stopped[$kind]:-0} + 1))
  done
  summary=""
  for k in double_delayed double_interleaved interior realloc_freed; do summary+=" $k=${stopped[$k]:-0}"; done
  if [[ $bad -eq 0 ]]; then pass "$build: all $SEEDS seeds stopped with the injected address:$summary"
  else fail "$build: $bad of $SEEDS seeds failed (stopped:$summary)"; fi
  for k in double_delayed double_interleaved interior realloc_freed; do
    [[ ${stopped[$k]:-0} -gt 0 ]] && pass "$build: $k injected and stopped ${stopped[$k]} times" || fail "$build: $k never injected and stopped"
  done
  unset stopped
done
finish
