#!/usr/bin/env bash
# Installs what a make target needs on a fresh Debian machine, and nothing that is already there.
# usage: tools/deps.sh build|fastpath|bench|real|install|checked
set -euo pipefail
need_pkgs=()
want() { # want COMMAND-or-FILE PACKAGE
  if [[ "$1" == /* ]]; then [[ -e "$1" ]] || need_pkgs+=("$2")
  else command -v "$1" >/dev/null 2>&1 || need_pkgs+=("$2"); fi
}
case "${1:-build}" in
  build)    want cmake cmake; want gcc gcc; want g++ g++; want make make; want python3 python3 ;;
  fastpath) want valgrind valgrind; want gcc gcc
            want /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 libjemalloc2
            want /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 libtcmalloc-minimal4
            want /usr/lib/x86_64-linux-gnu/libmimalloc.so.2 libmimalloc2.0 ;;
  bench)    want /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 libjemalloc2
            want /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 libtcmalloc-minimal4
            want /usr/lib/x86_64-linux-gnu/libmimalloc.so.2 libmimalloc2.0
            python3 -m venv --help >/dev/null 2>&1 || need_pkgs+=(python3-venv) ;;
  # mtbench's real family (bench/real): the programs it runs under each allocator. Debian's
  # python3 test suite is a package of its own, named after the python3 version.
  real)     want perl perl-base; want gcc gcc; want git git; want sqlite3 sqlite3
            want redis-server redis-server; want redis-benchmark redis-tools
            if [[ -x /usr/bin/python3 ]]; then
              v=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
              want "/usr/lib/python$v/test/test_dict.py" "libpython$v-testsuite"
            else want /usr/bin/python3 python3; fi ;;
  install)  want pkg-config pkgconf; want readelf binutils; want groff groff-base ;; # tests/install
  # tools/checked_build.sh tsan: gcc's ThreadSanitizer and UBSan runtimes (gcc-12 pulls them in
  # through libgcc-12-dev on Debian 12; checked in case a slimmer gcc lacks them).
  checked)  want "$(gcc -print-file-name=libtsan.so)" libgcc-12-dev
            want "$(gcc -print-file-name=libubsan.so)" libgcc-12-dev ;;
  *) echo "deps.sh: unknown target '$1' (expected build, fastpath, bench, real, install or checked)" >&2; exit 2 ;;
esac
[[ ${#need_pkgs[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "deps.sh: missing Debian packages: ${need_pkgs[*]} (run as root, or install them)" >&2; exit 1
fi
echo "deps.sh: installing ${need_pkgs[*]}" >&2
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
