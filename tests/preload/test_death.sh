#!/usr/bin/env bash
# Death tests: bad_free (tests/preload/bad_free.c, a plain program) misuses free/realloc under
# LD_PRELOAD=$QMALLOC_SO. For each pointer qmalloc does not own (stack, static array, mmap'ed page,
# interior of a small or a large block) the program must die by SIGABRT (status 134) after writing
# exactly one line on stderr:
#     qmalloc: free(): invalid pointer 0x<the address the program passed>
# (realloc(): for realloc). The immediate double free must die the same way with a line starting
# "qmalloc: free(): double free"; a double free of a large block must at least be stopped with a
# "qmalloc: free(): " line; a later double free (free p, free q, free p) is reported as INFO only,
# since the core promises to catch the immediate one.
set -u
source "$(dirname "$0")/common.sh"
require_env QMALLOC_SO QM_TEST_BIN
PROG=$QM_TEST_BIN/preload_bad_free
[[ -x $PROG ]] || { fail "missing test program $PROG"; finish; }

# run MODE: runs the program; sets STATUS, OUT (stdout), ERR (stderr file), ADDR (first stdout line)
run() {
  # the braces take bash's own "Aborted" job notice away from the test log
  { LD_PRELOAD=$QMALLOC_SO "$PROG" "$1" >"$QM_TMP/out" 2>"$QM_TMP/err"; } 2>/dev/null
  STATUS=$?
  ADDR=$(head -n1 "$QM_TMP/out")
  ERR=$QM_TMP/err
}

show() { sed 's/^/    | /' "$ERR" | head -5; }

run valid
if [[ $STATUS -eq 0 && ! -s $ERR ]]; then pass "valid use: exit 0, silent"
else fail "valid use: status $STATUS, stderr:"; show; fi

# expect_invalid MODE CALL
expect_invalid() {
  local mode=$1 call=$2 lines line got
  run "$mode"
  lines=$(grep -c '' "$ERR")
  line=$(head -n1 "$ERR")
  if [[ $STATUS -ne 134 ]]; then
    fail "$mode: exit status $STATUS, expected 134 (SIGABRT); stdout: $(tr '\n' ' ' <"$QM_TMP/out")stderr:"; show
    return
  fi
  if [[ $lines -ne 1 ]]; then
    fail "$mode: $lines lines on stderr, expected exactly 1:"; show
    return
  fi
  if ! [[ $line =~ ^qmalloc:\ (free|realloc)\(\):\ invalid\ pointer\ 0x[0-9a-f]+$ ]]; then
    fail "$mode: stderr line '$line' does not match '^qmalloc: (free|realloc)\\(\\): invalid pointer 0x[0-9a-f]+\$'"
    return
  fi
  if [[ $line != "qmalloc: $call(): "* ]]; then
    fail "$mode: stderr line '$line' names the wrong call (expected $call())"
    return
  fi
  got=${line##* }
  if [[ $ADDR =~ ^0x[0-9a-f]+$ ]] && (( got == ADDR )); then
    pass "$mode: '$line', status 134"
  else
    fail "$mode: reported address $got, the program passed $ADDR"
  fi
}

expect_invalid stack free
expect_invalid static free
expect_invalid mmap free
expect_invalid interior free
expect_invalid interior_large free
expect_invalid realloc_stack realloc
expect_invalid realloc_interior realloc

# Immediate double free: must be caught.
run double
line=$(head -n1 "$ERR")
if [[ $STATUS -eq 134 && $(grep -c '' "$ERR") -eq 1 && $line == "qmalloc: free(): double free"* ]]; then
  pass "double: '$line', status 134"
else
  fail "double (free(p); free(p) on malloc(100) = $ADDR): status $STATUS, expected 134 and one line 'qmalloc: free(): double free...'; stderr:"; show
fi

# Large block freed twice: the second free finds no live block; either message is acceptable.
run double_large
line=$(head -n1 "$ERR")
if [[ $STATUS -eq 134 && $(grep -c '' "$ERR") -eq 1 && $line =~ ^qmalloc:\ free\(\):\ (double\ free|invalid\ pointer) ]]; then
  pass "double_large: '$line', status 134"
else
  fail "double_large (free(p); free(p) on malloc(1 MiB) = $ADDR): status $STATUS, expected 134 and one 'qmalloc: free(): double free|invalid pointer' line; stderr:"; show
fi

# Non-immediate double free: only checked when it is caught.
run double_later
line=$(head -n1 "$ERR")
if [[ $STATUS -eq 134 ]]; then
  if [[ $line == "qmalloc: free(): double free"* && $(grep -c '' "$ERR") -eq 1 ]]; then pass "double_later: caught: '$line'"
  else fail "double_later: aborted, but stderr is not one 'qmalloc: free(): double free' line:"; show; fi
else
  echo "INFO double_later (free p, free q, free p): not caught (status $STATUS); not required"
fi

finish
