"""MathJax for pages the course writes, from a local copy: nothing is loaded from a CDN.

The copy comes from the `jupyter-server-mathjax` package (MathJax 2.7, the files Jupyter serves
itself), installed once into a folder beside the pages (`install_mathjax`), with a small
configuration file of ours loaded before it (`CONFIG_JS`): only elements of class `camp-math` are
typeset (the pages mark every formula so), TeX delimiters `\\(...\\)` and `\\[...\\]`, the STIX-Web
fonts that the package ships, no menu, no messages. A page loads exactly these two scripts by
relative URL (`script_tags`), so its Content-Security-Policy can stay `script-src 'self'` with no
inline script; where the folder is missing (a page copied elsewhere), formulas stay readable TeX.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

CONFIG_FILE = "camp-config.js"
COMBINED = "TeX-AMS-MML_HTMLorMML-full"    # the one combined configuration the package ships
CONFIG_JS = """window.MathJax = {
  messageStyle: "none",
  extensions: ["Safe.js"],   // students' TeX: no javascript: links, styles or classes
  showMathMenu: false,
  tex2jax: {inlineMath: [["\\\\(", "\\\\)"]], displayMath: [["\\\\[", "\\\\]"]], processEscapes: false,
            ignoreClass: "camp-page", processClass: "camp-math"},
  "HTML-CSS": {availableFonts: ["STIX-Web"], preferredFont: "STIX-Web", webFont: "STIX-Web", imageFont: null},
  menuSettings: {zoom: "None"}
};
"""
_SKIP = ("localization", "LICENSE", "__pycache__")


def mathjax_source() -> Path | None:
    """The installed MathJax folder (MathJax.js and its config/, jax/, extensions/, fonts/)."""
    try:
        import jupyter_server_mathjax
    except ImportError:
        return None
    static = Path(jupyter_server_mathjax.__file__).resolve().parent / "static"
    return static if (static / "MathJax.js").is_file() else None


def install_mathjax(dest: Path) -> Path | None:
    """Copy MathJax into `dest` (once: kept while its MathJax.js is the installed one) with our
    configuration; `dest`, or None when MathJax is not installed (pages then show TeX as text)."""
    source = mathjax_source()
    if source is None:
        return None
    dest = Path(dest)
    config = dest / CONFIG_FILE
    fresh = (config.is_file() and (dest / "MathJax.js").is_file()
             and config.read_text(encoding="utf-8") == CONFIG_JS
             and (dest / "MathJax.js").read_bytes() == (source / "MathJax.js").read_bytes())
    if not fresh:   # copied aside, then moved in: a page never sees half a copy
        staging = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source, staging, ignore=shutil.ignore_patterns(*_SKIP))
        (staging / CONFIG_FILE).write_text(CONFIG_JS, encoding="utf-8")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(staging, dest)
    return dest


def script_tags(url: str) -> str:
    """The two <script> elements that load MathJax from `url` (a relative folder URL)."""
    return (f"<script src='{url}/{CONFIG_FILE}'></script>"
            f"<script src='{url}/MathJax.js?config={COMBINED}'></script>")
