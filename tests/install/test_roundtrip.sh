#!/usr/bin/env bash
# `make install`, use, `make uninstall`, as a packager would run them: install the build CTest
# runs from into a scratch DESTDIR with PREFIX=/usr/local, then
#  - the installed files are exactly the expected list, the soname is libqmalloc.so.MAJOR
#    (readelf) and the two symlinks point the right way;
#  - consumer.c and consumer.cc build against it through pkg-config and through find_package,
#    each linked shared and static; each runs and checks it got qmalloc (consumer.c says how), the
#    shared ones need libqmalloc.so.MAJOR, the static ones do not and define malloc themselves;
#  - the installed launcher runs python3 under the installed library (--stats report, the library
#    in /proc/self/maps) and passes its exit status through;
#  - the man page is groff-clean and holds every option variable and every error of docs/;
#  - `make uninstall` with the same PREFIX and DESTDIR leaves no file behind.
# The .pc, the CMake package and the launcher are used where DESTDIR put them: they must find the
# rest relative to themselves. Needs pkg-config, readelf and groff: tools/deps.sh install.
set -u
source "$QM_SOURCE_DIR/tests/preload/common.sh"
require_env QM_SOURCE_DIR QM_BUILD_DIR
[[ ${QM_VERSION:-} =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { fail "environment: QM_VERSION (the project version, from ctest) is '${QM_VERSION:-}'"; finish; }

if ! deps_err=$("$QM_SOURCE_DIR/tools/deps.sh" install 2>&1); then
  echo "SKIP the tools this test needs cannot be installed here: $deps_err"
  exit 77
fi

MAJOR=${QM_VERSION%%.*}
ROOT=$QM_TMP/root
PREFIX=/usr/local
P=$ROOT$PREFIX
INSTALL_SRC=$QM_SOURCE_DIR/tests/install

# ---- make install -------------------------------------------------------------------------------
if make -s -C "$QM_SOURCE_DIR" install BUILD="$QM_BUILD_DIR" PREFIX=$PREFIX DESTDIR="$ROOT" >"$QM_TMP/install.log" 2>&1; then
  pass "make install PREFIX=$PREFIX DESTDIR=<scratch>"
else
  fail "make install failed:"; tail -20 "$QM_TMP/install.log" | sed 's/^/    | /'; finish
fi

expected="bin/qmalloc
bin/qmalloc-profile
include/qmalloc.h
include/qmalloc_version.h
lib/cmake/qmalloc/qmallocConfig.cmake
lib/cmake/qmalloc/qmallocConfigVersion.cmake
lib/cmake/qmalloc/qmallocTargets-CONFIG.cmake
lib/cmake/qmalloc/qmallocTargets.cmake
lib/libqmalloc-hardened.so
lib/libqmalloc-hardened.so.$MAJOR
lib/libqmalloc-hardened.so.$QM_VERSION
lib/libqmalloc.a
lib/libqmalloc.so
lib/libqmalloc.so.$MAJOR
lib/libqmalloc.so.$QM_VERSION
lib/pkgconfig/qmalloc-hardened.pc
lib/pkgconfig/qmalloc.pc
share/man/man3/qmalloc.3"
found=$(cd "$P" && find . \( -type f -o -type l \) | sed 's|^\./||; s|qmallocTargets-[a-z]*\.cmake|qmallocTargets-CONFIG.cmake|' | LC_ALL=C sort)
if [[ $found == "$expected" ]]; then pass "the installed files are exactly the $(wc -l <<<"$found") expected"
else fail "installed files differ from the expected list:"; diff <(echo "$expected") <(echo "$found") | sed 's/^/    | /'; fi
outside=$(cd "$ROOT" && find . -mindepth 1 \( -type f -o -type l \) -not -path ".$PREFIX/*")
[[ -z $outside ]] && pass "nothing installed outside DESTDIR/PREFIX" || fail "installed outside the prefix: $outside"

soname=$(readelf -d "$P/lib/libqmalloc.so.$QM_VERSION" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $soname == "libqmalloc.so.$MAJOR" ]] && pass "readelf: soname $soname" || fail "readelf: soname '$soname', expected libqmalloc.so.$MAJOR"
if [[ $(readlink "$P/lib/libqmalloc.so") == "libqmalloc.so.$MAJOR" && $(readlink "$P/lib/libqmalloc.so.$MAJOR") == "libqmalloc.so.$QM_VERSION" ]]; then
  pass "symlinks: libqmalloc.so -> libqmalloc.so.$MAJOR -> libqmalloc.so.$QM_VERSION"
else
  fail "symlinks: libqmalloc.so -> $(readlink "$P/lib/libqmalloc.so"), libqmalloc.so.$MAJOR -> $(readlink "$P/lib/libqmalloc.so.$MAJOR")"
fi
[[ -x $P/bin/qmalloc ]] && pass "bin/qmalloc is executable" || fail "bin/qmalloc is not executable"

# ---- programs built against the installed copy ----------------------------------------------------
# check_program NAME EXE shared|static: runs and prints its line; NEEDED libqmalloc.so.MAJOR or not.
check_program() {
  local name=$1 exe=$2 link=$3 out st needed
  out=$("$exe" 2>"$QM_TMP/$name.err"); st=$?
  if [[ $st -eq 0 && $out == *"qmalloc $QM_VERSION,"* ]]; then pass "$name: runs: $out"
  else fail "$name: status $st, output '$out'"; head -5 "$QM_TMP/$name.err" | sed 's/^/    | /'; fi
  needed=$(readelf -d "$exe" | grep -c "NEEDED.*\[libqmalloc\.so\.$MAJOR\]")
  if [[ $link == shared ]]; then
    [[ $needed -eq 1 ]] && pass "$name: needs libqmalloc.so.$MAJOR" || fail "$name: readelf -d shows no NEEDED libqmalloc.so.$MAJOR"
  elif [[ $needed -eq 0 ]] && nm "$exe" | grep -qE ' T malloc$'; then
    pass "$name: static: malloc defined in the executable, no libqmalloc.so needed"
  else
    fail "$name: static link still needs libqmalloc.so or lacks malloc"
  fi
}

# build NAME COMMAND...: one compiler run, its errors shown on failure.
build() {
  local name=$1; shift
  if "$@" >"$QM_TMP/$name.build" 2>&1; then return 0; fi
  fail "$name: build failed: $*"; head -20 "$QM_TMP/$name.build" | sed 's/^/    | /'; return 1
}

export PKG_CONFIG_PATH=$P/lib/pkgconfig
modversion=$(pkg-config --modversion qmalloc 2>&1)
[[ $modversion == "$QM_VERSION" ]] && pass "pkg-config --modversion qmalloc: $modversion" || fail "pkg-config --modversion qmalloc: '$modversion'"
cflags=$(pkg-config --cflags qmalloc); libs=$(pkg-config --libs qmalloc); libdir=$(pkg-config --variable=libdir qmalloc)
others=$(pkg-config --static --libs-only-other qmalloc)
B=$QM_TMP/pc
mkdir -p "$B"
# shellcheck disable=SC2086 # the flags are lists
{
  build pc-c-shared gcc -o "$B/c_shared" "$INSTALL_SRC/consumer.c" $cflags $libs -Wl,-rpath,"$libdir" && check_program pc-c-shared "$B/c_shared" shared
  build pc-cxx-shared g++ -o "$B/cxx_shared" "$INSTALL_SRC/consumer.cc" $cflags $libs -Wl,-rpath,"$libdir" && check_program pc-cxx-shared "$B/cxx_shared" shared
  build pc-c-static gcc -o "$B/c_static" "$INSTALL_SRC/consumer.c" $cflags "$libdir/libqmalloc.a" $others && check_program pc-c-static "$B/c_static" static
  build pc-cxx-static g++ -o "$B/cxx_static" "$INSTALL_SRC/consumer.cc" $cflags "$libdir/libqmalloc.a" $others && check_program pc-cxx-static "$B/cxx_static" static
}

C=$QM_TMP/cmake
if cmake -S "$INSTALL_SRC/consumer" -B "$C" -DCMAKE_PREFIX_PATH="$P" -DQM_EXPECTED_VERSION="$QM_VERSION" >"$QM_TMP/cmake.log" 2>&1 &&
   cmake --build "$C" -j 2 >>"$QM_TMP/cmake.log" 2>&1; then
  pass "find_package(qmalloc $QM_VERSION EXACT): configures and builds 4 programs"
  for t in c_shared cxx_shared; do check_program "cmake-$t" "$C/$t" shared; done
  for t in c_static cxx_static; do check_program "cmake-$t" "$C/$t" static; done
else
  fail "find_package consumer did not build:"; tail -20 "$QM_TMP/cmake.log" | sed 's/^/    | /'
fi

# ---- the installed launcher -----------------------------------------------------------------------
out=$("$P/bin/qmalloc" --stats -- python3 -c 'print(sum(range(10)))' 2>"$QM_TMP/launch.err"); st=$?
if [[ $st -eq 0 && $out == 45 ]] && grep -q "^-* qmalloc $QM_VERSION\$" "$QM_TMP/launch.err"; then
  pass "qmalloc --stats -- python3 -c ...: prints 45, and qmalloc's report at exit"
else
  fail "qmalloc --stats -- python3: status $st, output '$out', no 'qmalloc $QM_VERSION' report on stderr"; head -5 "$QM_TMP/launch.err" | sed 's/^/    | /'
fi
check_stats "launcher --stats" "$QM_TMP/launch.err" 1
real_lib=$(readlink -f "$P/lib/libqmalloc.so.$QM_VERSION")
maps=$("$P/bin/qmalloc" -- python3 -c 'print(open("/proc/self/maps").read())' 2>&1)
grep -qF "$real_lib" <<<"$maps" && pass "python3 under the launcher maps the installed $real_lib" ||
  fail "python3 under the launcher does not map $real_lib"
"$P/bin/qmalloc" -- python3 -c 'import sys; sys.exit(7)'; st=$?
[[ $st -eq 7 ]] && pass "launcher passes the exit status through (7)" || fail "launcher exit status $st, expected 7"

# ---- the man page ---------------------------------------------------------------------------------
MAN=$P/share/man/man3/qmalloc.3
warnings=$(groff -man -ww -z "$MAN" 2>&1)
[[ -z $warnings ]] && pass "qmalloc.3: groff -man -ww reports nothing" || fail "qmalloc.3: groff: $(head -3 <<<"$warnings")"
grep -q "^\.TH QMALLOC 3 .*qmalloc $QM_VERSION" "$MAN" && pass "qmalloc.3: .TH names version $QM_VERSION" || fail "qmalloc.3: no .TH line with version $QM_VERSION"
missing=""
for v in $(grep -o '^| `QMALLOC_[A-Z_]*`' "$QM_SOURCE_DIR/docs/options.md" | tr -d '|` '); do
  grep -qF "$v" "$MAN" || missing+=" $v"
done
n_errors=0
while IFS= read -r msg; do
  n_errors=$((n_errors + 1))
  head=${msg%%…*} # the man page spells characters beyond ASCII as \[uXXXX]: compare the part before
  grep -qF "$(sed 's/\\/\\e/g; s/-/\\-/g' <<<"$head" | cut -c1-40)" "$MAN" || missing+=" '$msg'"
done < <(sed -n 's/^| `\(qmalloc: [^`]*\)`.*/\1/p' "$QM_SOURCE_DIR/docs/errors.md")
if [[ -z $missing && $n_errors -gt 10 ]]; then pass "qmalloc.3: every option variable and all $n_errors messages of docs/errors.md"
else fail "qmalloc.3: missing:$missing (messages found in docs/errors.md: $n_errors)"; fi

# ---- make uninstall -------------------------------------------------------------------------------
if make -s -C "$QM_SOURCE_DIR" uninstall BUILD="$QM_BUILD_DIR" PREFIX=$PREFIX DESTDIR="$ROOT" >"$QM_TMP/uninstall.log" 2>&1; then
  pass "make uninstall PREFIX=$PREFIX DESTDIR=<scratch>"
else
  fail "make uninstall failed:"; tail -20 "$QM_TMP/uninstall.log" | sed 's/^/    | /'
fi
left=$(cd "$ROOT" && find . -mindepth 1 \( -type f -o -type l \))
[[ -z $left ]] && pass "after uninstall no file is left under DESTDIR" || fail "left after uninstall: $left"
[[ ! -e $P/lib/cmake/qmalloc ]] && pass "lib/cmake/qmalloc removed" || fail "lib/cmake/qmalloc still there"

finish
