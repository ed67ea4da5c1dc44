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
# Every case runs under the default library ($QMALLOC_SO) and the hardened one
# ($QM_HARDENED_SO, names prefixed "hardened:"); then the hardened build's own classes
# (overflows, underflows, writes and reads after free, malloc(0)), which must each stop with their
# line or fault (SIGSEGV at the address the program announced).
set -u
source "$(dirname "$0")/common.sh"
require_env QMALLOC_SO QM_HARDENED_SO QM_TEST_BIN
# The heap profiler (on by default) serves a sampled block as whole pages whatever its size
# (docs/profiling.md): these cases are about the size classes, so no sampling here, whatever the
# environment says; the "sampled:" run below has every block sampled.
export QMALLOC_PROF_SAMPLE=0
PROG=$QM_TEST_BIN/preload_bad_free
[[ -x $PROG ]] || { fail "missing test program $PROG"; finish; }

# run MODE: runs the program under $SO; sets STATUS, OUT (stdout), ERR (stderr file), ADDR (first stdout line)
# Under an emulator (QM_TEST_EMULATOR, tests/cross/run.sh: qemu-user) the preload is the guest's
# (-E), and the emulator's own line about the signal that killed the guest is not the program's.
run() {
  # the braces take bash's own "Aborted" job notice away from the test log
  if [[ -n ${QM_TEST_EMULATOR:-} ]]; then
    # shellcheck disable=SC2086 # the emulator's command line is words
    { $QM_TEST_EMULATOR -E LD_PRELOAD="$SO" "$PROG" "$1" >"$QM_TMP/out" 2>"$QM_TMP/err"; } 2>/dev/null
    STATUS=$?
    sed -i '/^qemu: uncaught target signal /d' "$QM_TMP/err"
  else
    { LD_PRELOAD=$SO "$PROG" "$1" >"$QM_TMP/out" 2>"$QM_TMP/err"; } 2>/dev/null
    STATUS=$?
  fi
  ADDR=$(head -n1 "$QM_TMP/out")
  ERR=$QM_TMP/err
}

show() { sed 's/^/    | /' "$ERR" | head -5; }
pass() { echo "PASS $LABEL$*"; QM_PASSED=$((QM_PASSED + 1)); }
fail() { echo "FAIL $LABEL$*"; QM_FAILED=$((QM_FAILED + 1)); }

common_cases() {
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
  if ! [[ $line =~ ^qmalloc:\ (free|realloc|malloc_usable_size)\(\):\ invalid\ pointer\ 0x[0-9a-f]+$ ]]; then
    fail "$mode: stderr line '$line' does not match '^qmalloc: (free|realloc|malloc_usable_size)\\(\\): invalid pointer 0x[0-9a-f]+\$'"
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
expect_invalid noncanonical free
expect_invalid low_address free
expect_invalid interior free
expect_invalid interior_large free
expect_invalid realloc_stack realloc
expect_invalid realloc_interior realloc
expect_invalid realloc_freed realloc
expect_invalid realloc_freed_move realloc
expect_invalid usable_freed malloc_usable_size
expect_invalid usable_interior malloc_usable_size

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

# expect_line MODE REGEX WHAT: status 134, exactly one stderr line matching REGEX, naming the address
# the program announced.
expect_line() {
  local mode=$1 re=$2 what=$3 line got
  run "$mode"
  line=$(head -n1 "$ERR")
  if [[ $STATUS -ne 134 || $(grep -c '' "$ERR") -ne 1 || ! $line =~ $re ]]; then
    fail "$mode ($what): status $STATUS, expected 134 and one line matching '$re'; stdout: $(tr '\n' ' ' <"$QM_TMP/out")stderr:"; show
    return
  fi
  got=${line##* }
  if [[ $ADDR =~ ^0x[0-9a-f]+$ ]] && (( got == ADDR )); then pass "$mode ($what): '$line'"
  else fail "$mode ($what): reported $got, the program passed $ADDR"; fi
}

# Issue 12: every double and invalid free is stopped, for small, medium and large blocks.
DF='^qmalloc: free\(\): double free 0x[0-9a-f]+$'
expect_line double_later "$DF" "free p, free q, free p on malloc(100)"
for sz in small medium large; do
  expect_line later_$sz "$DF" "free p, free q, free p ($sz)"
  expect_line remote_$sz "$DF" "p freed by another thread, then here ($sz)"
done
# Slots of a class's span (a sampled block is in none).
if [[ -z $SAMPLED ]]; then
  for sz in small medium; do
    expect_line slot_free_$sz "$DF" "free of a slot that is free ($sz)"
    expect_line slot_new_$sz '^qmalloc: free\(\): (double free|invalid pointer) 0x[0-9a-f]+$' "free of a slot never handed out ($sz)"
  done
fi
# The default build carves a span's slots as they are taken: a slot on a page not carved yet has no
# page-map entry for free()'s fast path, and the slow path finds no object there.
if [[ -z $LABEL ]]; then
  expect_line slot_uncarved '^qmalloc: free\(\): invalid pointer 0x[0-9a-f]+$' "free of a slot on a page of the span not carved yet (20000 B)"
fi
SZ='^qmalloc: free_sized\(\): size [0-9]+ does not match the block 0x[0-9a-f]+$'
expect_line sized_wrong "$SZ" "free_sized(p, 1000) of malloc(100)"
expect_line sized_wrong_large "$SZ" "free_sized(p, 3 MiB) of malloc(1 MiB)"
expect_line delete_array "$SZ" "sized operator delete with a smaller size (delete on a new[] array)"
# Guard pages around huge blocks: an access just off either end dies of SIGSEGV (status 139).
for side in after before; do
  run guard_$side
  if [[ $STATUS -eq 139 ]]; then pass "guard_$side: a write just $side a 64 MiB block faulted"
  else fail "guard_$side: status $STATUS, expected 139 (SIGSEGV); stdout: $(tr '\n' ' ' <"$QM_TMP/out")"; fi
done
# The hardened build keeps freed blocks in a quarantine first: the overwritten words are found when
# the block leaves it, or at exit. (A sampled block is on no free list.)
[[ -n $SAMPLED ]] && return
if [[ -z $LABEL ]]; then CL='^qmalloc: malloc\(\): corrupted free list \(a write after free\?\) at 0x[0-9a-f]+$'
else CL='^qmalloc: (malloc|free|exit)\(\): (corrupted free list \(a write after free\?\) at|write after free) 0x[0-9a-f]+$'; fi
expect_line corrupt_link "$CL" "link overwritten after free, then malloc"
# The same found where a list goes back to its spans (here malloc_trim flushes the thread's cache).
if [[ -z $LABEL ]]; then CT='^qmalloc: free\(\): corrupted free list \(a write after free\?\) at 0x[0-9a-f]+$'; else CT=$CL; fi
expect_line corrupt_tag_trim "$CT" "tag cleared after free, then malloc_trim"
expect_line corrupt_link_trim "$CT" "link overwritten after free with a live block's address, then malloc_trim"
expect_line corrupt_tag_thread_exit "$CT" "tag cleared after free, then the thread exits"
}

# expect_fault MODE WHAT: killed by SIGSEGV (status 139) at the address the program announced,
# nothing on stderr.
expect_fault() {
  local mode=$1 what=$2 got
  run "$mode"
  got=$(sed -n 's/^fault //p' "$QM_TMP/out" | head -n1)
  if [[ $STATUS -ne 139 || -s $ERR || -z $got ]]; then
    fail "$mode ($what): status $STATUS, expected 139 (SIGSEGV) and a 'fault <address>' line; stdout: $(tr '\n' ' ' <"$QM_TMP/out")stderr:"; show
    return
  fi
  if [[ $ADDR =~ ^0x[0-9a-f]+$ ]] && (( got == ADDR )); then pass "$mode ($what): SIGSEGV at $got"
  else fail "$mode ($what): faulted at $got, expected the announced $ADDR"; fi
}

SO=$QMALLOC_SO LABEL="" SAMPLED=""
common_cases
SO=$QM_HARDENED_SO LABEL="hardened: "
common_cases

# The hardened build's own classes.
OV='^qmalloc: free\(\): overflow past the end of the block 0x[0-9a-f]+$'
# An underflow lands in the last word of the block before, which that block's checks find: its free,
# its hand-out once freed and reused, realloc, the exit check. One byte leaves the word's low byte as
# it was, and the report names the block that underflowed; eight overwrite the whole word, as an
# 8-byte overflow of the block before reaching its record (no canary) does, and the report names the
# block before (bad_free announces the block the report must name).
un() { echo "^qmalloc: $1\\(\\): underflow \\(the bytes before the block were overwritten\\) 0x[0-9a-f]+\$"; }
EITHER='^qmalloc: free\(\): overflow past the end of the block, or underflow of the block after it 0x[0-9a-f]+$'
WAF='^qmalloc: malloc\(\): write after free 0x[0-9a-f]+$'
CORRUPT='^qmalloc: malloc\(\): corrupted free list \(a write after free\?\) at 0x[0-9a-f]+$'
for sz in small medium tiny; do
  expect_line underflow1_$sz "$(un free)" "1-byte underflow before a block, then the live block before it freed ($sz)"
  expect_line underflow1_free_$sz "$(un malloc)" "1-byte underflow before a block whose neighbour was freed, then its class reused ($sz)"
  expect_line underflow8_$sz "$EITHER" "8-byte underflow before a block, then the live block before it freed ($sz)"
done
for sz in small medium; do
  expect_line underflow8_free_$sz "$WAF" "8-byte underflow before a block whose neighbour was freed, then its class reused ($sz)"
done
expect_line underflow8_free_tiny "$CORRUPT" "8-byte underflow before an 8-byte block whose neighbour was freed (its free tag), then reused"
expect_line underflow1_realloc "$(un realloc)" "1-byte underflow before a block, then realloc of the live block before it"
expect_line underflow1_exit "$(un exit)" "1-byte underflow before a block whose neighbour is in the quarantine at exit"
expect_line underflow1_trim_tiny "$(un free)" "1-byte underflow before an 8-byte block whose freed neighbour's list goes back to its span"
expect_line underflow1_trim_medium "$(un free)" "1-byte underflow before a medium block, then its span emptied and given back to the page heap"
for k in 1 8; do
  for sz in small medium; do
    expect_line overflow${k}_$sz "$OV" "$k-byte overflow past malloc's size ($sz)"
  done
  expect_fault overflow${k}_large "$k-byte overflow past a 1 MiB block: its guard page"
done
for sz in smallfit mediumfit; do
  expect_line overflow1_$sz "$OV" "1-byte overflow past a request that reaches its record ($sz: no canary bytes)"
  # (the plain overflow when the block is its span's last: nothing after it to have underflowed)
  expect_line overflow8_$sz "^qmalloc: free\\(\\): overflow past the end of the block(, or underflow of the block after it)? 0x[0-9a-f]+\$" \
    "8-byte overflow past a request that reaches its record ($sz: no canary bytes)"
done
# A new thread's quarantine holds its first frees (its ring read "next slot 0" and let the first go
# at the second free).
run quarantine_new_thread
if [[ $STATUS -eq 0 && ! -s $ERR ]]; then pass "quarantine_new_thread: a new thread's first two freed blocks not handed out again"
else fail "quarantine_new_thread: status $STATUS, stderr:"; show; fi
expect_line overflow_shrunk "$OV" "1-byte overflow past a block realloc shrank in place (1000 -> 600 bytes)"
for sz in small medium; do
  expect_line uaf_write_$sz "$WAF" "write after free, then mallocs of its size ($sz)"
done
expect_line uaf_write_trim_medium '^qmalloc: free\(\): write after free 0x[0-9a-f]+$' "write after free, then malloc_trim returns its span to the page heap"
expect_fault uaf_write_large "write after free of a 1 MiB block"
expect_fault uaf_read_large "read after free of a 1 MiB block"
expect_fault zero_read "read of malloc(0)'s block"
expect_fault zero_write "write to malloc(0)'s block"

# Every block sampled by the heap profiler: at its default of one sample per 2 MiB, 9% of 200 KB blocks
# are sampled. A sampled block is whole pages of its own; its frees must be
# checked as its class's would be.
SO=$QMALLOC_SO LABEL="sampled: " SAMPLED=1 QMALLOC_PROF_SAMPLE=1
common_cases
SAMPLED="" QMALLOC_PROF_SAMPLE=0

LABEL=""
finish
