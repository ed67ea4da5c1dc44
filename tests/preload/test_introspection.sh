#!/usr/bin/env bash
# glibc's introspection API served by qmalloc under LD_PRELOAD, in a plain program and in python3:
# mallinfo2 sees what the program allocated, malloc_trim releases, mallopt answers as glibc does,
# malloc_info is well-formed XML in glibc's shape, malloc_stats writes glibc's lines to stderr,
# and QMALLOC_STATS=2 writes JSON whose identity adds up.
set -u
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass+1)); echo "PASS $1"; else fail=$((fail+1)); echo "FAIL $1"; fi; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
prog=$QM_TEST_BIN/preload_introspect

LD_PRELOAD=$QMALLOC_SO "$prog" >"$work/out" 2>"$work/err"; rc=$?
check "program runs under qmalloc" "[ $rc -eq 0 ]"
read -r _ uord _ hblkhd _ arena < <(grep '^uordblks' "$work/out")
check "mallinfo2 counts the 1000 x 1000 bytes in use" "[ ${uord:-0} -ge 1000000 ] && [ ${uord:-0} -lt 1400000 ]"
check "mallinfo2 counts the 64 MiB block as mmapped" "[ ${hblkhd:-0} -eq $((64 << 20)) ]"
read -r _ _ uord2 _ fsm _ keep < <(grep '^after-free' "$work/out")
check "after free, in-use bytes drop" "[ ${uord2:-1} -lt 100000 ]"
check "malloc_trim(0) reports a release" "grep -q '^trim 1$' '$work/out'"
check "after trim, nothing is left to trim" "grep -q '^after-trim keepcost 0$' '$work/out'"
check "mallopt: known 1, ignored 1, bad value 0" "grep -q '^mallopt 1 1 0$' '$work/out'"
sed -n '/^--xml--$/,$p' "$work/out" | tail -n +2 >"$work/xml"
check "malloc_info is glibc-shaped XML" "python3 -c \"
import sys, xml.etree.ElementTree as ET
root = ET.parse('$work/xml').getroot()
assert root.tag == 'malloc' and root.get('version') == '1'
assert root.find('heap/sizes') is not None
assert int(root.find(\\\"system[@type='current']\\\").get('size')) > 0
\""
check "malloc_stats prints glibc's lines to stderr" "grep -q '^system bytes' '$work/err' && grep -q '^in use bytes' '$work/err'"

# python3 allocating through malloc, statistics as JSON at exit
QMALLOC_STATS=2 PYTHONMALLOC=malloc LD_PRELOAD=$QMALLOC_SO python3 -c "
d = {i: str(i) * 3 for i in range(200000)}
print(len(d))" >"$work/py.out" 2>"$work/py.err"; rc=$?
check "python3 runs under qmalloc" "[ $rc -eq 0 ] && grep -q '^200000$' '$work/py.out'"
check "QMALLOC_STATS=2 gives JSON whose lines add up to the mapped bytes" "python3 -c \"
import json
lines = [l for l in open('$work/py.err') if l.startswith('{\\\"qmalloc\\\"')]
s = json.loads(lines[-1])
parts = ['in_use','thread_caches','transfer_caches','central_free','pageheap_free','released','metadata']
assert sum(s[p] for p in parts) == s['mapped'], s
assert s['refills'] > 0 and s['mapped'] > 0
assert all(c['in_use'] >= 0 and c['size'] > 0 for c in s['classes'])
\""
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
