#!/usr/bin/env bash
# Real programs under LD_PRELOAD=$QMALLOC_SO (preload-programs: the default build;
# hardened-preload-programs: the hardened one), each checked for a correct result AND for qmalloc
# having served its allocations: with QMALLOC_STATS=1 qmalloc prints its statistics to stderr at
# exit, including a line "MALLOC: <n> ... mapped from the OS", and n must be > 0.
#  - python3 with PYTHONMALLOC=malloc runs programs/churn.py (dicts, lists, strings, threads; a few
#    hundred MB of churn), which checks its own results and looks for libqmalloc in /proc/self/maps;
#  - sort (two threads, large buffer) sorts a generated 1,000,000-line file, compared byte for byte
#    with the same sort run without qmalloc;
#  - gcc compiles programs/compute.c (driver, cc1, as and ld all preloaded) and the result runs
#    correctly, also under qmalloc.
set -u
source "$(dirname "$0")/common.sh"
require_env QMALLOC_SO QM_SOURCE_DIR
PROGRAMS=$QM_SOURCE_DIR/tests/preload/programs

# under_qmalloc OUT ERR CMD...: runs CMD preloaded with statistics on; returns its status.
under_qmalloc() {
  local out=$1 err=$2
  shift 2
  LD_PRELOAD=$QMALLOC_SO QMALLOC_STATS=1 "$@" >"$out" 2>"$err"
}
show_err() { head -"${2:-5}" "$1" | sed 's/^/    | /'; }

# ---- python3 ----------------------------------------------------------------------------------
# The distribution's interpreter itself, not a version-manager shim script that execs it.
PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3)
if [[ -n $PY ]]; then
  PYTHONMALLOC=malloc under_qmalloc "$QM_TMP/py.out" "$QM_TMP/py.err" "$PY" "$PROGRAMS/churn.py"
  st=$?
  if [[ $st -eq 0 ]] && grep -qx 'churn: OK' "$QM_TMP/py.out"; then pass "python3 churn.py: results correct"
  else fail "python3 churn.py: status $st, stdout: $(tr '\n' ' ' <"$QM_TMP/py.out")"; show_err "$QM_TMP/py.err"; fi
  if grep -qx 'maps: libqmalloc mapped' "$QM_TMP/py.out"; then pass "python3: libqmalloc is in its /proc/self/maps"
  else fail "python3: libqmalloc not found in its /proc/self/maps"; fi
  check_stats "python3" "$QM_TMP/py.err" 1
else
  fail "python3 not installed"
fi

# ---- sort -------------------------------------------------------------------------------------
"$PY" - "$QM_TMP/lines.txt" <<'EOF'
import random, sys
r = random.Random(20240501)
alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
with open(sys.argv[1], "w") as f:
    for i in range(1_000_000):
        word = "".join(r.choice(alphabet) for _ in range(r.randint(1, 24)))
        f.write(f"{word} {r.randint(-10**9, 10**9)}\n")
EOF
export LC_ALL=C
sort -S 200M --parallel=2 "$QM_TMP/lines.txt" >"$QM_TMP/ref1" 2>/dev/null
sort -S 200M --parallel=2 -k2,2n -k1,1 "$QM_TMP/lines.txt" >"$QM_TMP/ref2" 2>/dev/null
under_qmalloc "$QM_TMP/qm1" "$QM_TMP/sort1.err" sort -S 200M --parallel=2 "$QM_TMP/lines.txt"
st1=$?
under_qmalloc "$QM_TMP/qm2" "$QM_TMP/sort2.err" sort -S 200M --parallel=2 -k2,2n -k1,1 "$QM_TMP/lines.txt"
st2=$?
if [[ $st1 -eq 0 ]] && cmp -s "$QM_TMP/ref1" "$QM_TMP/qm1" && [[ $(wc -l <"$QM_TMP/qm1") -eq 1000000 ]]; then
  pass "sort: 1,000,000 lines, identical to sort without qmalloc"
else fail "sort: status $st1, output differs from sort without qmalloc"; show_err "$QM_TMP/sort1.err"; fi
if [[ $st2 -eq 0 ]] && cmp -s "$QM_TMP/ref2" "$QM_TMP/qm2"; then pass "sort -k2,2n -k1,1: identical to sort without qmalloc"
else fail "sort -k2,2n -k1,1: status $st2, output differs from sort without qmalloc"; show_err "$QM_TMP/sort2.err"; fi
# sort closes stderr itself at exit (coreutils close_stdout), before qmalloc's exit report runs:
# the report only survives if qmalloc writes it to a descriptor it kept for that.
check_stats "sort" "$QM_TMP/sort1.err" 1
# Second proof: sort reads a FIFO whose write end this shell holds open, so it cannot finish
# before its /proc/PID/maps has been read. Once it has the FIFO open it is past its startup.
mkfifo "$QM_TMP/fifo"
exec 3<>"$QM_TMP/fifo"
LD_PRELOAD=$QMALLOC_SO sort -S 200M --parallel=2 "$QM_TMP/fifo" >"$QM_TMP/qm3" 2>"$QM_TMP/sort3.err" 3>&- &
pid=$!
for ((i = 0; i < 1200; i++)); do # wait for the open (at most 60 s: only a hang would get there)
  # sort itself (not the forked shell before its exec, which still holds fd 3 on the FIFO)
  [[ $(readlink /proc/$pid/exe 2>/dev/null) == */sort ]] && ls -l /proc/$pid/fd 2>/dev/null | grep -q "$QM_TMP/fifo" && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.05
done
# The library file QMALLOC_SO names (libqmalloc.so.N or libqmalloc-hardened.so.N), not just any.
lib_file=$(basename "$(readlink -f "$QMALLOC_SO")")
if grep -q "/$lib_file\$" /proc/$pid/maps 2>/dev/null; then pass "sort: $lib_file is in /proc/$pid/maps while it runs"
else fail "sort: $lib_file not found in /proc/$pid/maps (sort running: $(kill -0 $pid 2>/dev/null && echo yes || echo no))"; fi
cat "$QM_TMP/lines.txt" >&3
exec 3>&-
wait $pid
st3=$?
if [[ $st3 -eq 0 ]] && cmp -s "$QM_TMP/ref1" "$QM_TMP/qm3"; then pass "sort from a FIFO: identical to sort without qmalloc"
else fail "sort from a FIFO: status $st3, output differs"; show_err "$QM_TMP/sort3.err"; fi

# ---- gcc --------------------------------------------------------------------------------------
# once without statistics, so that any line on stderr is a diagnostic; once with them
LD_PRELOAD=$QMALLOC_SO gcc -O2 -Wall -o "$QM_TMP/compute" "$PROGRAMS/compute.c" >"$QM_TMP/gcc.out" 2>"$QM_TMP/gcc.err"
st=$?
if [[ $st -eq 0 && -x $QM_TMP/compute && ! -s $QM_TMP/gcc.err ]]; then
  pass "gcc -O2 compute.c under qmalloc: compiled, no diagnostics"
else fail "gcc under qmalloc: status $st; stderr:"; show_err "$QM_TMP/gcc.err" 10; fi
under_qmalloc "$QM_TMP/gcc2.out" "$QM_TMP/gcc2.err" gcc -O2 -Wall -o "$QM_TMP/compute2" "$PROGRAMS/compute.c"
st=$?
if [[ $st -eq 0 ]] && cmp -s "$QM_TMP/compute" "$QM_TMP/compute2"; then
  pass "gcc under qmalloc with QMALLOC_STATS=1: same binary again"
else fail "gcc under qmalloc with QMALLOC_STATS=1: status $st, or a different binary"; fi
# the driver, cc1, as, collect2 and ld each report: at least the driver and cc1 must
check_stats "gcc (driver and its subprocesses)" "$QM_TMP/gcc2.err" 2
if [[ -x $QM_TMP/compute ]]; then
  out=$("$QM_TMP/compute")
  st=$?
  if [[ $st -eq 0 && $out == "compute: primes=9592 sorted=yes list=ok" ]]; then pass "compiled program runs: $out"
  else fail "compiled program: status $st, output '$out'"; fi
  under_qmalloc "$QM_TMP/c.out" "$QM_TMP/c.err" "$QM_TMP/compute"
  st=$?
  if [[ $st -eq 0 && $(cat "$QM_TMP/c.out") == "compute: primes=9592 sorted=yes list=ok" ]]; then
    pass "compiled program under qmalloc: $(cat "$QM_TMP/c.out")"
  else fail "compiled program under qmalloc: status $st, output '$(cat "$QM_TMP/c.out")'"; show_err "$QM_TMP/c.err"; fi
  check_stats "compiled program" "$QM_TMP/c.err" 1
fi

finish
