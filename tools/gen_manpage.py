#!/usr/bin/env python3
"""Writes the man page qmalloc(3) from the docs, so that nothing in it is written twice.

SYNOPSIS comes from include/qmalloc.h (its prototypes), OPTIONS from docs/options.md, STATISTICS
from docs/stats.md and DIAGNOSTICS from docs/errors.md; only NAME, the one-paragraph DESCRIPTION
and SEE ALSO are written here. It converts the Markdown those pages use (headings, paragraphs,
lists, fenced code, tables, `code`, **bold**, [links](...)) into man(7) macros, and nothing more:
other Markdown is copied as text. Standard library only. Called by cmake/install.cmake at build
time; `python3 tools/gen_manpage.py --version 0.1.0 --source . --output qmalloc.3` by hand.
"""
import argparse
import re
import sys
from pathlib import Path

# (section title, source page): each page's "# title" line is replaced by the section title, its
# "## headings" become subsections.
SECTIONS = [("OPTIONS", "docs/options.md"), ("STATISTICS", "docs/stats.md"), ("DIAGNOSTICS", "docs/errors.md")]

DESCRIPTION = (
    "qmalloc is a thread-caching malloc for Linux: per-thread caches with no locks on the fast path, "
    "central free lists, a page heap that gives free pages back to the OS. It replaces malloc, free, "
    "the rest of the C allocation family and C++ new/delete, either by linking with \\-lqmalloc "
    "(or libqmalloc.a) or, without recompiling, by preloading libqmalloc.so, which the qmalloc "
    "command does. The qm_* functions are the same calls under names that cannot be interposed, "
    "plus qmalloc's own introspection."
)

SYNOPSIS_USAGE = [
    "qmalloc [\\-\\-stats] [\\-\\-option NAME=VALUE]... \\-\\- PROGRAM [ARGS...]",
    "LD_PRELOAD=PREFIX/lib/libqmalloc.so PROGRAM [ARGS...]",
    "cc prog.c $(pkg\\-config \\-\\-cflags \\-\\-libs qmalloc)",
    "find_package(qmalloc) ... target_link_libraries(prog qmalloc::qmalloc)",
]


def escape(text):
    """Plain text to roff: backslashes escaped, characters beyond ASCII as \\[uXXXX] (troff reads
    bytes, not UTF-8)."""
    text = text.replace("\\", "\\e")
    return "".join(c if ord(c) < 128 else "\\[u%04X]" % ord(c) for c in text)


def code_text(text):
    """Text shown literally (code spans, code blocks): also keeps '-' a minus, not a hyphen."""
    return escape(text).replace("-", "\\-")


def inline(text):
    """Inline Markdown to roff fonts: `code` and **bold** bold, [text](target) just its text."""
    out = []
    for i, part in enumerate(re.split(r"(`[^`]*`)", text)):
        if i % 2 == 1:
            out.append("\\fB" + code_text(part[1:-1]) + "\\fR")
            continue
        part = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", part)
        part = escape(part)
        part = re.sub(r"\*\*([^*]+)\*\*", r"\\fB\1\\fR", part)
        out.append(part)
    return "".join(out)


def line_safe(line):
    """A text line must not start with '.' or ''' (roff would read it as a request)."""
    return "\\&" + line if line[:1] in (".", "'") else line


def table_cells(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def render_table(rows, out):
    """A table becomes a tagged list: the first cell is the tag; the other cells follow, each
    under its column's header unless the table has only two columns."""
    header, body = table_cells(rows[0]), [table_cells(r) for r in rows[2:]]
    for cells in body:
        out.append(".TP")
        out.append(line_safe(inline(cells[0])))
        rest = list(zip(header[1:], cells[1:]))
        for k, (name, cell) in enumerate(rest):
            if k:
                out.append(".br")
            text = inline(cell) if len(header) == 2 or not name else "%s: %s" % (inline(name), inline(cell))
            out.append(line_safe(text))


def convert(markdown, title):
    """One docs page to roff lines under .SH title."""
    out = [".SH " + title]
    lines = markdown.splitlines()
    i, para = 0, []

    def flush():
        if para:
            out.append(".PP")
            out.append(line_safe(inline(" ".join(para))))
            para.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            block = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                block.append(lines[i])
                i += 1
            out += [".PP", ".RS 4", ".nf"] + ["\\&" + code_text(b) for b in block] + [".fi", ".RE"]
        elif stripped.startswith("# "):
            flush()  # the page's title: replaced by the section title
        elif stripped.startswith("#"):
            flush()
            out.append(".SS " + inline(stripped.lstrip("#").strip()))
        elif stripped.startswith("|"):
            flush()
            rows = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(lines[i])
                i += 1
            render_table(rows, out)
            continue
        elif re.match(r"^(- |\d+\. )", stripped):
            flush()
            marker = re.match(r"^(- |\d+\. )", stripped).group(1).strip()
            item = [stripped[len(marker) + 1 :]]
            i += 1
            while i < len(lines) and lines[i].startswith("  ") and lines[i].strip():
                item.append(lines[i].strip())
                i += 1
            tag = "\\(bu" if marker == "-" else marker
            out += [".IP %s 4" % tag, line_safe(inline(" ".join(item)))]
            continue
        elif not stripped:
            flush()
        else:
            para.append(stripped)
        i += 1
    flush()
    return out


def synopsis(header):
    """The public prototypes of include/qmalloc.h, joined where they span lines."""
    text = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    protos = re.findall(r"^[a-z][^#{}();]*\([^;]*\);", text, flags=re.M)
    out = [".SH SYNOPSIS", ".nf", "\\fB#include <qmalloc.h>\\fR", ""]
    out += [code_text(" ".join(p.split())) for p in protos]
    out += ["", "Link with \\fI\\-lqmalloc\\fR (or libqmalloc.a), or preload it:", ""]
    out += ["\\fB" + u + "\\fR" for u in SYNOPSIS_USAGE]
    out.append(".fi")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", required=True, help="qmalloc's version (CMake's PROJECT_VERSION)")
    ap.add_argument("--source", default=".", help="the source tree (holds docs/ and include/)")
    ap.add_argument("--output", required=True, help="the man page to write")
    args = ap.parse_args()
    src = Path(args.source)
    try:
        header = (src / "include/qmalloc.h").read_text()
        pages = [(title, (src / path).read_text()) for title, path in SECTIONS]
    except OSError as e:
        sys.exit("gen_manpage.py: %s: %s" % (e.filename, e.strerror))
    if not re.fullmatch(r"\d+\.\d+\.\d+", args.version):
        sys.exit("gen_manpage.py: --version must be MAJOR.MINOR.PATCH, got '%s'" % args.version)

    out = ['.TH QMALLOC 3 "" "qmalloc %s" "qmalloc manual"' % args.version]
    out += [".SH NAME", "qmalloc \\- thread\\-caching malloc and free, and the qmalloc command"]
    out += synopsis(header)
    out += [".SH DESCRIPTION", ".PP", DESCRIPTION]
    for title, text in pages:
        out += convert(text, title)
    out += [".SH SEE ALSO", ".BR malloc (3),", ".BR ld.so (8);",
            "docs/design.md in the qmalloc sources: the layers, one malloc and one free walked through them."]
    out_path = Path(args.output)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
