"""The one machine-readable line every mtbench program prints (format in docs/mtbench.md):

    RESULT bench=NAME key=value key=value ...

Values are ints, floats or bare words. Parsing is strict - a malformed line is an error, never a
silently partial record - because everything downstream (tables, plots) trusts these figures."""

import re

PREFIX = "RESULT "
_KEY = re.compile(r"^[a-z][a-z0-9_]*$")
# Every program appends these after its own figures (bench_common.c, result_end).
COMMON_KEYS = ("cpu_user_s", "cpu_sys_s", "minflt", "peak_rss_kb", "rss_end_kb")


class ResultLineError(ValueError):
    pass


def _value(text):
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse(line):
    """Parses one RESULT line into a dict (with 'bench' as its first key)."""
    line = line.strip()
    if not line.startswith(PREFIX):
        raise ResultLineError(f"not a result line: {line[:60]!r}")
    fields = {}
    for token in line[len(PREFIX):].split():
        key, sep, value = token.partition("=")
        if not sep or not _KEY.match(key) or value == "":
            raise ResultLineError(f"malformed field {token!r} in result line")
        if key in fields:
            raise ResultLineError(f"duplicate field {key!r} in result line")
        fields[key] = _value(value)
    if "bench" not in fields:
        raise ResultLineError("result line has no bench= field")
    for key in COMMON_KEYS:
        if not isinstance(fields.get(key), (int, float)):
            raise ResultLineError(f"result line lacks the numeric field {key}")
    return fields


def find_one(stdout):
    """The single RESULT line of a program's output; zero or several is an error."""
    lines = [l for l in stdout.splitlines() if l.startswith(PREFIX)]
    if len(lines) != 1:
        raise ResultLineError(f"expected exactly one RESULT line, found {len(lines)}")
    return parse(lines[0])
