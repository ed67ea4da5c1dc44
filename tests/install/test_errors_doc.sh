#!/usr/bin/env bash
# docs/errors.md (and so the DIAGNOSTICS of qmalloc(3), generated from it) lists every message the
# library can print on bad input: each format string in src/ given to log_fatal, check_fail,
# check_fail_invalid, check_fail_double_free, or to log_printf(2, "qmalloc: ...") (warnings and
# notes) must match one of the messages in the page's tables, its conversions (%s, %p, %zu,
# ...) standing for any text. A new message in src/ fails this test until the page has it; so does
# a message the page lost. The page's own count of messages must also not shrink below the
# sources' (each documented message is matched by at least one format).
set -u
source "$QM_SOURCE_DIR/tests/preload/common.sh"
require_env QM_SOURCE_DIR

report=$(python3 - "$QM_SOURCE_DIR" <<'PY'
import re, sys
from pathlib import Path

root = Path(sys.argv[1])
doc = (root / "docs/errors.md").read_text()
library_part = doc.split("## The launcher")[0]  # the launcher's messages come from tools/qmalloc
documented = re.findall(r"^\| `(qmalloc: [^`]*)`", library_part, flags=re.M)  # first cells of the tables
literal = r'"((?:[^"\\]|\\.)*)"'
formats = []  # (file, message format as printed, "qmalloc: " included)
for path in sorted((root / "src").glob("*.[ch]*")):
    text = path.read_text()
    for m in re.finditer(r"\blog_fatal\(\s*" + literal, text):
        formats.append((path.name, "qmalloc: " + m.group(1)))
    for m in re.finditer(r"\bcheck_fail\(\s*" + literal, text):
        formats.append((path.name, "qmalloc: " + m.group(1) + " %p"))
    for m in re.finditer(r"\blog_printf\(\s*2,\s*" + literal, text):
        if m.group(1).startswith("qmalloc: "):
            formats.append((path.name, m.group(1).rstrip("\\n").replace("\\n", "")))
# check.c's own formats take the call's name or the whole text as %s ("%s: invalid pointer %p" is
# kept, "%s %p" says nothing by itself: its callers' texts are collected above).
formats = [(w, f) for w, f in formats if re.sub(r"%[-0-9.*]*[a-z]+|[ :]", "", f[len("qmalloc: "):])]
def pattern(fmt):
    """A printf format as a regex over the page's spelling: each conversion stands for any text."""
    parts = re.split(r"%[-0-9.*]*(?:zu|lld|llu|d|u|s|p|x|c)", fmt)
    return re.compile("^" + ".+".join(re.escape(p) for p in parts) + "$")

matched_docs = set()
for where, fmt in formats:
    rx = pattern(fmt)
    hits = [d for d in documented if rx.match(d)]
    if hits:
        matched_docs.update(hits)
        print("PASS %s: '%s' is documented as '%s'" % (where, fmt, hits[0]))
    else:
        print("FAIL %s: '%s' is not in docs/errors.md" % (where, fmt))
unmatched = [d for d in documented if d not in matched_docs]
if unmatched:
    print("FAIL docs/errors.md lists messages no format in src/ prints: %s" % "; ".join(unmatched))
elif len(formats) < 10:
    print("FAIL only %d message formats found in src/: the extraction is broken" % len(formats))
else:
    print("PASS all %d library messages of docs/errors.md come from src/ (%d formats)" % (len(documented), len(formats)))
PY
)
while IFS= read -r line; do
  case $line in
    PASS\ *) pass "${line#PASS }" ;;
    FAIL\ *) fail "${line#FAIL }" ;;
    *) echo "$line" ;;
  esac
done <<<"$report"
finish
