"""Plain-text tables for the `camp` command's output, and making untrusted text inert.

Anything that came from a submission (student ids, file names in any encoding, messages that
quote student code) passes through one of the functions below before a person sees it:
`inert` for a terminal, `csv_cell` for a spreadsheet, `html_text` for a browser.
"""
from __future__ import annotations

import csv
import html
import os
import unicodedata
from pathlib import Path

# control (Cc), format incl. bidi overrides and zero-width (Cf), lone surrogates from undecodable
# file names (Cs), private use (Co), unassigned (Cn), line/paragraph separators (Zl, Zp)
_UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
# OWASP CSV injection: a cell starting with one of these is a formula for a spreadsheet
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")


def unsafe_char(ch: str) -> bool:
    """A character that is invisible, reorders text, drives a terminal or is not decodable."""
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES


def _escape_char(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def inert(text: object, limit: int | None = None, keep: str = "") -> str:
    """`text` with every control, bidi, invisible or undecodable character written as a visible
    escape (\\x1b, \\u202e, \\udcff): safe to print in a terminal, and always encodable as UTF-8.
    `limit` cuts the result to that many characters (marking the cut); characters in `keep`
    (e.g. newline and tab for code shown in a page) stay as they are."""
    s = str(text)
    if limit is not None and len(s) > limit:
        s = s[:limit]
        cut = True
    else:
        cut = False
    out = "".join(_escape_char(c) if c not in keep and unsafe_char(c) else c for c in s)
    if limit is not None and len(out) > limit:
        out, cut = out[:limit], True
    return out + ("..." if cut else "")




def csv_cell(value: object) -> object:
    """A grade-sheet cell: numbers as they are, text made inert and, when a spreadsheet would
    read it as a formula (first non-blank character = + - @, or a tab/CR/LF), prefixed with a
    quote as OWASP recommends."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    s = str(value)
    if s.startswith(_FORMULA_STARTS) or s.lstrip(" ").startswith(_FORMULA_STARTS):
        s = "'" + s
    return inert(s)


def write_inert_csv(path: Path, header: list[str], rows) -> None:
    """A CSV a spreadsheet can open safely: every cell through `csv_cell`, written to a temporary
    file and moved into place, so a reader never sees half a sheet."""
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([csv_cell(v) for v in row] for row in rows)
    os.replace(tmp, path)


def html_text(text: object, limit: int | None = None, keep: str = "") -> str:
    """`text` escaped for HTML (element content and quoted attributes), control and bidi
    characters made visible (except those in `keep`, e.g. "\n\t" inside <pre>)."""
    return html.escape(inert(text, limit, keep), quote=True)


def format_table(headers: list[str], rows: list[list[object]], width: int = 160) -> str:
    """Aligned columns; every cell made inert and cut to `width` characters."""
    cells = [[inert(h, width) for h in headers]] + [[inert(c, width) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
