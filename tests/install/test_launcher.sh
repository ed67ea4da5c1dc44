#!/usr/bin/env bash
# The launcher (tools/qmalloc) on good and bad input, in both places it runs from:
#  - installed: `cmake --install` of the CTest build into a scratch prefix, bin/qmalloc finding
#    lib/libqmalloc.so.MAJOR; from the source tree: a copy of tools/qmalloc next to a build/ link
#    to the CTest build (the layout `tools/qmalloc` sees in a checkout) finding build/libqmalloc.so;
#  - options reach the program (QMALLOC_<NAME> in its environment, the library's verbose dump);
#  - --hardened preloads the hardened build beside the default one (its malloc(0) block faults);
#  - every bad input of docs/errors.md ("The launcher"; a set-user-ID program too) gives exactly one line on stderr naming
#    the problem, the documented status, and the program never runs (it would create a file);
#  - --help prints the usage and exits 0; the program's exit status and arguments pass through.
set -u
source "$QM_SOURCE_DIR/tests/preload/common.sh"
require_env QM_SOURCE_DIR QM_BUILD_DIR

P=$QM_TMP/prefix
if ! cmake --install "$QM_BUILD_DIR" --prefix "$P" >"$QM_TMP/install.log" 2>&1; then
  fail "cmake --install into a scratch prefix failed:"; tail -5 "$QM_TMP/install.log" | sed 's/^/    | /'; finish
fi
INSTALLED=$P/bin/qmalloc
mkdir -p "$QM_TMP/checkout/tools"
cp "$QM_SOURCE_DIR/tools/qmalloc" "$QM_TMP/checkout/tools/qmalloc"
ln -s "$QM_BUILD_DIR" "$QM_TMP/checkout/build"
IN_TREE=$QM_TMP/checkout/tools/qmalloc
QM_ZERO_WRITE=$QM_TMP/zero-write # writes a byte into malloc(0)'s block
printf '#include <stdlib.h>\nint main(void) { volatile char *p = malloc(0); p[0] = 1; return 0; }\n' >"$QM_TMP/zero-write.c"
cc -o "$QM_ZERO_WRITE" "$QM_TMP/zero-write.c" || { fail "cannot compile the malloc(0) writer"; finish; }
MARK=$QM_TMP/program-ran
SYNOPSIS='qmalloc [--stats] [--hardened] [--profile] [--option NAME=VALUE]... [--] PROGRAM [ARGS...]'
SYNOPSIS_RE=$(sed 's/[][\.*^$()+?{}|]/\\&/g' <<<"$SYNOPSIS") # as a regular expression
SETUID=$QM_TMP/setuid-touch # a set-user-ID program (a copy of touch): must be refused, not run
cp "$(type -P touch)" "$SETUID" && chmod u+s "$SETUID"

# expect_error NAME STATUS PATTERN LAUNCHER ARGS...: one stderr line matching PATTERN (a bash
# regex), exit STATUS, and the program (which would touch $MARK) did not run.
expect_error() {
  local name=$1 want=$2 pattern=$3 st lines line; shift 3
  rm -f "$MARK"
  "$@" >/dev/null 2>"$QM_TMP/err"; st=$?
  lines=$(grep -c '' "$QM_TMP/err"); line=$(head -n 1 "$QM_TMP/err")
  if [[ $st -eq $want && $lines -eq 1 && $line =~ $pattern && ! -e $MARK ]]; then pass "$name: status $st, '$line'"
  else fail "$name: status $st (expected $want), $lines line(s) (expected 1), program ran: $([[ -e $MARK ]] && echo yes || echo no); stderr:"
       sed 's/^/    | /' "$QM_TMP/err"; fi
}

for where in installed in-tree; do
  L=$INSTALLED; lib=$(readlink -f "$P/lib/libqmalloc.so")
  [[ $where == in-tree ]] && { L=$IN_TREE; lib=$(readlink -f "$QM_BUILD_DIR/libqmalloc.so"); }

  # The program runs under qmalloc with the options set, and its status and arguments pass through.
  out=$("$L" --option decay_ms=2s --option=TCACHE_MAX=1M --option verbose=1 -- \
        bash -c 'grep -c qmalloc /proc/self/maps >/dev/null && echo "$QMALLOC_DECAY_MS $QMALLOC_TCACHE_MAX $1"; exit 3' prog 'a b' 2>"$QM_TMP/verbose")
  st=$?
  if [[ $st -eq 3 && $out == "2s 1M a b" ]] && grep -q "^qmalloc: option decay_ms *= 2000 .*set by QMALLOC_DECAY_MS" "$QM_TMP/verbose" &&
     grep -q "^qmalloc: option tcache_max *= 1M .*set by QMALLOC_TCACHE_MAX" "$QM_TMP/verbose"; then
    pass "$where: options reach the program and the library; status 3 and the argument 'a b' pass through"
  else
    fail "$where: status $st (expected 3), output '$out' (expected '2s 1M a b'); stderr:"; head -5 "$QM_TMP/verbose" | sed 's/^/    | /'
  fi
  maps=$("$L" cat /proc/self/maps)
  grep -qF "$lib" <<<"$maps" && pass "$where: the program maps $lib" || fail "$where: the program does not map $lib"
  # --hardened preloads the hardened build instead: malloc(0)'s block faults when written there.
  hard=$(readlink -f "$(dirname "$lib")/$(basename "$lib" | sed 's/^libqmalloc\./libqmalloc-hardened./')")
  maps=$("$L" --hardened cat /proc/self/maps)
  if grep -qF "$hard" <<<"$maps" && ! grep -qF "$lib" <<<"$maps"; then pass "$where: --hardened maps $hard and not $lib"
  else fail "$where: --hardened: the program's maps name $(grep -o 'libqmalloc[^ ]*' <<<"$maps" | sort -u | paste -sd' ')"; fi
  { "$L" --hardened "$QM_ZERO_WRITE"; } 2>/dev/null; st=$?
  "$L" "$QM_ZERO_WRITE"; st_default=$?
  [[ $st -eq 139 && $st_default -eq 0 ]] && pass "$where: a write to malloc(0)'s block faults with --hardened (status 139), not without" ||
    fail "$where: a write to malloc(0)'s block: status $st with --hardened (expected 139), $st_default without (expected 0)"
  usage=$("$L" --help 2>&1); st=$?
  [[ $st -eq 0 && $usage == "usage: qmalloc "* ]] && pass "$where: --help prints the usage, status 0" || fail "$where: --help: status $st, '$usage'"

  touch_mark=(touch "$MARK")
  expect_error "$where: missing program" 127 "^qmalloc: no-such-program-qm: program not found in PATH$" "$L" -- no-such-program-qm
  expect_error "$where: missing path" 127 "^qmalloc: /no/such/file: no such file$" "$L" /no/such/file
  expect_error "$where: not executable" 126 "not an executable file$" "$L" -- "$QM_SOURCE_DIR/README.md"
  expect_error "$where: setuid program" 2 "^qmalloc: $SETUID: set-user-ID or set-group-ID program; the loader would not preload qmalloc into it$" "$L" -- "$SETUID"
  expect_error "$where: unknown option" 2 "^qmalloc: unknown option 'decay' \(options: tcache_max, .*decay_ms.*\)$" "$L" --option decay=1 -- "${touch_mark[@]}"
  expect_error "$where: tooling variable is no option" 2 "^qmalloc: unknown option 'so' " "$L" --option so=x -- "${touch_mark[@]}"
  expect_error "$where: bad value" 2 "^qmalloc: bad option value: QMALLOC_DECAY_MS=abc is not valid \(expected milliseconds 0..3600000 or never\)$" "$L" --option decay_ms=abc -- "${touch_mark[@]}"
  expect_error "$where: out of range" 2 "^qmalloc: bad option value: QMALLOC_MIN_ALIGN=32 " "$L" --option min_align=32 "${touch_mark[@]}"
  expect_error "$where: option without =" 2 "^qmalloc: --option needs NAME=VALUE, got 'decay_ms'$" "$L" --option decay_ms -- "${touch_mark[@]}"
  expect_error "$where: option without argument" 2 "^qmalloc: --option needs NAME=VALUE$" "$L" --option
  expect_error "$where: bad name" 2 "^qmalloc: 'a-b' is not an option name" "$L" --option a-b=1 -- "${touch_mark[@]}"
  expect_error "$where: unknown flag" 2 "^qmalloc: unknown flag '--stat' \(see qmalloc --help\)$" "$L" --stat -- "${touch_mark[@]}"
  # The short usage names every flag, as --help's first line does.
  expect_error "$where: no program" 2 "^qmalloc: no program given \(usage: $SYNOPSIS_RE\)$" "$L" --stats --
  first=$("$L" --help | head -n 1)
  if [[ $first == "usage: $SYNOPSIS" ]]; then pass "$where: --help's first line is the synopsis"
  else fail "$where: --help's first line is '$first'"; fi
  expect_error "$where: --profile with --hardened" 2 "^qmalloc: --profile and --hardened cannot be combined: the hardened build samples nothing$" "$L" --hardened --profile -- "${touch_mark[@]}"
done

# Library problems, with a launcher installed into a prefix of its own.
mkdir -p "$QM_TMP/bare/bin" "$QM_TMP/bare/lib"
cp "$INSTALLED" "$QM_TMP/bare/bin/qmalloc"
expect_error "no library" 2 "^qmalloc: cannot find the qmalloc library: .*/bare/bin/../lib/libqmalloc.so.[0-9]+ does not exist$" \
  "$QM_TMP/bare/bin/qmalloc" -- touch "$MARK"
for f in "$P"/lib/libqmalloc.so.*.*; do echo "not an ELF file" >"$QM_TMP/bare/lib/$(basename "${f%.*.*}")"; done
expect_error "damaged library" 2 "^qmalloc: .*/bare/lib/libqmalloc.so.[0-9]+ did not load as qmalloc: .*cannot be preloaded" \
  "$QM_TMP/bare/bin/qmalloc" -- touch "$MARK"
mkdir -p "$QM_TMP/with space/bin"
cp -r "$P/lib" "$QM_TMP/with space/"
cp "$INSTALLED" "$QM_TMP/with space/bin/qmalloc"
expect_error "space in the prefix" 2 "^qmalloc: the library path '.*' contains a space or a colon, which LD_PRELOAD cannot carry$" \
  "$QM_TMP/with space/bin/qmalloc" -- touch "$MARK"

finish
