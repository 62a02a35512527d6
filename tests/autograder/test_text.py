"""Untrusted text made inert for a terminal, a spreadsheet and a browser."""
from autograder.text import csv_cell, format_table, html_text, inert


def test_inert_makes_controls_bidi_and_undecodable_bytes_visible():
    hostile = "a\x1b[2Jb\u202ec\u2066d\u200be\x00f\udcff\x85g\u2028"
    s = inert(hostile)
    assert s == "a\\x1b[2Jb\\u202ec\\u2066d\\u200be\\x00f\\udcffg".replace("g", "\\x85g") + "\\u2028"
    s.encode("utf-8")                                                   # always writable
    assert inert("x" * 50, limit=10) == "x" * 10 + "..."
    assert inert("a\tb\nc", keep="\n") == "a\\x09b\nc"


def test_csv_cells_and_html():
    assert csv_cell("=1+1") == "'=1+1" and csv_cell(" @x") == "' @x" and csv_cell("-") == "'-"
    assert csv_cell(12.5) == 12.5 and csv_cell("plain") == "plain"
    assert html_text("<a href='x'>\u202e") == "&lt;a href=&#x27;x&#x27;&gt;\\u202e"


def test_table_cells_are_inert():
    table = format_table(["student", "message"], [["\x1b]0;pwn\x07", "\u202eevil\nnext"]])
    assert "\x1b" not in table and "\u202e" not in table and "\x07" not in table
    assert len(table.splitlines()) == 3
