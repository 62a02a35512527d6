"""MathJax for pages the course writes, never from a CDN: a page finds a local copy itself.

MathJax 2.7 comes from the `jupyter-server-mathjax` package (the files Jupyter serves itself). A
page carries one small inline loader (`loader_script`, allowed by its hash in the page's
Content-Security-Policy: `script-src 'self' 'sha256-...'`, nothing else inline) that configures
MathJax (only elements of class `camp-math` are typeset, TeX delimiters `\\(...\\)` and `\\[...\\]`,
drawn as the browser's own MathML, the Safe extension, no menu, no messages) and loads
MathJax.js from the first place that has it:
- where a Jupyter server serves the page (JupyterLab's "Open in New Browser Tab", or its HTML
  viewer once trusted: the page's URL holds `/files/`), the server's own copy at
  `static/jupyter_server_mathjax`, which it serves without a login: the tab Jupyter opens is
  sandboxed (a unique origin, so no cookie goes with the page's requests);
- else the page's relative places, in order (a feedback page: the feedback folder's `.mathjax`
  that `camp grade` installs, `install_mathjax`, then `<lab>/feedback/FETCHED_DIR`, which the
  course's fetch step installs beside a page nbgrader's fetch_feedback copied).
A place that has no copy is one failed load and the next is tried. The page is never rewritten
where it is read: nbgrader's Assignment List compares a fetched page's bytes with the exchange's
to offer "view feedback". With scripts off (JupyterLab's HTML viewer until "Trust HTML") or no
copy anywhere, formulas stay readable TeX, and a <noscript> line says how to typeset them.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from pathlib import Path

FETCHED_DIR = "mathjax"   # in <lab>/feedback/, beside nbgrader's <timestamp>/ folders (not hidden: Jupyter serves it)
COMBINED = "TeX-AMS-MML_HTMLorMML-full"    # the one combined configuration the package ships
SERVED = "static/jupyter_server_mathjax"    # the package's route on a Jupyter server
MARKER = "data-camp-mathjax"               # the loader's <script> attribute: a page that looks for MathJax
CONFIG = {
    "messageStyle": "none",
    "extensions": ["Safe.js"],   # students' TeX: no javascript: links, styles or classes
    "showMathMenu": False,
    "tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]], "processEscapes": False,
                "ignoreClass": "camp-page", "processClass": "camp-math"},
    # the browser's own MathML (every current browser draws MathML Core): no web font to load,
    # which a page in Jupyter's sandboxed tab (a unique origin) could not fetch from the server
    "menuSettings": {"zoom": "None", "renderer": "NativeMML"},
}
_LOADER = """(function () {
  var places = %(places)s;
  var served = /^(https?:.*?)\\/files\\//.exec(document.baseURI);
  if (served) places.unshift(served[1] + "/%(served)s");
  window.MathJax = %(config)s;
  function next() {
    var place = places.shift();
    if (place === undefined) return;
    var script = document.createElement("script");
    script.src = new URL(place + "/MathJax.js?config=%(combined)s", document.baseURI).href;
    script.onerror = function () { script.remove(); next(); };
    document.head.appendChild(script);
  }
  next();
})();"""
NOSCRIPT = ("<noscript><p class='camp-hint'>Formulas are shown as TeX: in JupyterLab, press \u201cTrust HTML\u201d "
            "in this page's toolbar (or open it in a new browser tab) to typeset them.</p></noscript>")  # in <body>
# not copied: translations, and the SVG output's fonts (the package ships no SVG output to use them)
_SKIP = ("localization", "LICENSE", "__pycache__", "SVG")


def mathjax_source() -> Path | None:
    """The installed MathJax folder (MathJax.js and its config/, jax/, extensions/, fonts/)."""
    try:
        import jupyter_server_mathjax
    except ImportError:
        return None
    static = Path(jupyter_server_mathjax.__file__).resolve().parent / "static"
    return static if (static / "MathJax.js").is_file() else None


def install_mathjax(dest: Path) -> Path | None:
    """Copy MathJax into `dest` (once: kept while its MathJax.js is the installed one); `dest`,
    or None when MathJax is not installed (pages then show TeX as text)."""
    source = mathjax_source()
    if source is None:
        return None
    dest = Path(dest)
    fresh = (dest / "MathJax.js").is_file() and (dest / "MathJax.js").read_bytes() == (source / "MathJax.js").read_bytes()
    if not fresh:   # copied aside, then moved in: a page never sees half a copy
        staging = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source, staging, ignore=shutil.ignore_patterns(*_SKIP))
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(staging, dest)
    return dest


def loader_js(places: list[str]) -> str:
    """The loader's source, trying `places` (folder URLs relative to the page, no trailing /)."""
    return _LOADER % {"places": json.dumps(places), "served": SERVED, "config": json.dumps(CONFIG),
                      "combined": COMBINED}


def loader_script(places: list[str]) -> tuple[str, str]:
    """(the <script> element for a page's <head>, the CSP source that allows exactly it: its hash)."""
    js = loader_js(places)
    digest = base64.b64encode(hashlib.sha256(js.encode("utf-8")).digest()).decode("ascii")
    return f"<script {MARKER}>{js}</script>", f"'sha256-{digest}'"
