# A few modules of python3's own regression suite (python3 -m test), when the suite is
# installed (Debian: libpython3.X-testsuite). SCALE: how many modules of the list below.
source "$(dirname "$0")/common.sh"
modules=(test_dict test_set test_list test_json test_re test_collections test_string test_unicode
         test_bisect test_heapq test_itertools test_functools)
case "$verb" in
  check) [[ -n "$python" ]] || { echo "python3 not found (Debian package python3)"; exit 1; }
         v=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
         "$python" -c 'import test.libregrtest, test.test_dict' >/dev/null 2>&1 ||
           { echo "python3's test suite is not installed (Debian package libpython$v-testsuite)"; exit 1; } ;;
  setup) ;;
  run) n=$(( scale < ${#modules[@]} ? scale : ${#modules[@]} ))
       # A fixed seed: test_dict's test_copy_fuzz draws its dicts' sizes from `random`, and the
       # draws above and below a table size apart peaked 8-10 MB apart under every allocator
       # (29.6-39.8 MB, six runs under one); --randseed seeds it (and shuffles the modules' order
       # with it, the same order every run).
       cd "$dir" && "$python" -m test -q --randseed=1 "${modules[@]:0:$n}" >&2 ;;
esac
