"""`make lab`'s Jupyter as nbgrader and JupyterLab read it: the ready labs released for an
instructor (Formgrader calls them released and lists the exchange once), the course's settings
in course/jupyter/ (no news prompt for anyone; nbgrader's instructor tools off for students,
with plugin and extension names that exist in the installed nbgrader), and Formgrader's MathJax
served by the server itself."""
import json
import logging
import re
from pathlib import Path

import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.exchange_list import ExchangeList
from autograder.course.nbgrader_setup import (
    COURSE_ID,
    formgrader_template_dirs,
    instructor_config,
    nbgrader_api,
    prepare_instructor_folders,
    release_ready_labs,
)

ROOT = repo_root()
SETTINGS = ROOT / "course" / "jupyter"
READY = [lab.name for lab in Catalog.load().ready()]
INSTRUCTOR_PLUGINS = {"@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:course-list",
                      "@jupyter/nbgrader:create-assignment"}
INSTRUCTOR_SERVER_EXTENSIONS = {"nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.course_list"}
# JUPYTER_CONFIG_PATH as the Makefile's `lab` target sets it, per ROLE
CONFIG_PATH = {"student": [SETTINGS / "student", SETTINGS / "everyone"], "instructor": [SETTINGS / "everyone"]}


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    monkeypatch.setenv("CAMP_GRADING_DIR", str(tmp_path / "grading"))
    monkeypatch.setenv("CAMP_EXCHANGE_DIR", str(tmp_path / "exchange"))
    return prepare_instructor_folders(ROOT)


def _released_listings(make_api, pages=1) -> list[int]:
    """How many times nbgrader logs "Released assignments" (to the server's log, as Formgrader
    runs it) for each of `pages` assignment lists, the API made while the log is watched."""
    seen = []

    class Count(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    log = logging.getLogger("traitlets")   # NbGraderAPI's log, in the server and here
    handler, old = Count(level=logging.INFO), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    counts = []
    try:
        api = make_api()
        for _ in range(pages):
            api.get_assignments()
            counts.append(sum(m == "Released assignments:" for m in seen))
            seen.clear()
    finally:
        log.removeHandler(handler)
        log.setLevel(old)
    return counts


def test_instructor_releases_every_ready_lab_once_and_formgrader_says_released(workspace, monkeypatch):
    _, exchange = workspace
    monkeypatch.setattr(ExchangeList, "_logged", {})
    api = nbgrader_api(instructor_config(ROOT))
    assert {a["name"]: a["status"] for a in api.get_assignments()}[READY[0]] == "draft"
    assert release_ready_labs(ROOT) == (READY, "")
    assert release_ready_labs(ROOT) == ([], "")          # what is already there stays as it is
    outbound = exchange / COURSE_ID / "outbound"
    assert sorted(p.name for p in outbound.iterdir()) == sorted(READY)
    for name in READY:
        assert (outbound / name / f"{name}.ipynb").read_bytes() == (ROOT / "labs" / name / f"{name}.ipynb").read_bytes()
    assert {a["status"] for a in api.get_assignments()} == {"released"}


def test_the_exchange_listing_is_logged_when_it_changes_not_on_every_page(workspace, monkeypatch):
    from traitlets.config import Config

    monkeypatch.setattr(ExchangeList, "_logged", {})
    plain = Config(instructor_config(ROOT))
    plain.ExchangeFactory.list = "nbgrader.exchange.default.list.ExchangeList"
    assert _released_listings(lambda: nbgrader_api(plain))[0] > len(READY)   # nbgrader's: once per lab, none released
    assert _released_listings(lambda: nbgrader_api(instructor_config(ROOT)), pages=3) == [1, 0, 0]
    release_ready_labs(ROOT)
    assert _released_listings(lambda: nbgrader_api(instructor_config(ROOT)), pages=3) == [1, 0, 0]   # it changed
    assert _released_listings(lambda: nbgrader_api(plain), pages=3)[1:] == [1, 1]   # nbgrader's: once per page


def _with_config_path(monkeypatch, role):
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", ":".join(str(p) for p in CONFIG_PATH[role]))


@pytest.mark.parametrize("role", ["student", "instructor"])
def test_no_news_prompt_nor_update_check_for_anyone(monkeypatch, role, tmp_path):
    from jupyterlab_server.settings_utils import _get_overrides

    _with_config_path(monkeypatch, role)
    overrides, error = _get_overrides(str(tmp_path))
    assert not error
    notification = overrides["@jupyterlab/apputils-extension:notification"]
    assert notification == {"fetchNews": "false", "checkForUpdates": False}
    schema = json.loads((Path(_lab_dir()) / "schemas" / "@jupyterlab" / "apputils-extension" / "notification.json")
                        .read_text())["properties"]       # the names and values JupyterLab knows
    assert {c["const"] for c in schema["fetchNews"]["oneOf"]} >= {notification["fetchNews"]}
    assert schema["checkForUpdates"]["type"] == "boolean"


def _lab_dir() -> str:
    from jupyterlab.commands import get_app_dir

    return get_app_dir()


def _nbgrader_plugins() -> set[str]:
    from jupyter_core.paths import jupyter_path

    bundle = next(Path(p) / "@jupyter" / "nbgrader" / "static" for p in jupyter_path("labextensions")
                  if (Path(p) / "@jupyter" / "nbgrader").is_dir())
    return {m for f in bundle.glob("*.js") for m in re.findall(r'"(@jupyter/nbgrader:[a-z-]+)"', f.read_text())}


@pytest.mark.parametrize("role", ["student", "instructor"])
def test_instructor_tools_are_off_for_students_only(monkeypatch, role):
    from jupyter_core.paths import jupyter_path
    from jupyter_server.serverapp import ServerApp
    from jupyterlab_server.config import get_page_config

    _with_config_path(monkeypatch, role)
    plugins = _nbgrader_plugins()
    assert INSTRUCTOR_PLUGINS <= plugins and "@jupyter/nbgrader:validate-assignment" in plugins, plugins
    disabled = get_page_config(jupyter_path("labextensions"))["disabledExtensions"]   # a list, or {id: bool}
    disabled = {k for k in disabled if not isinstance(disabled, dict) or disabled[k]}
    app = ServerApp()
    app.find_server_extensions()                           # as the server does at start
    extensions = app.jpserver_extensions
    assert INSTRUCTOR_SERVER_EXTENSIONS | {"nbgrader.server_extensions.validate_assignment"} <= set(extensions)
    if role == "student":
        assert disabled & plugins == INSTRUCTOR_PLUGINS
        assert {k for k in INSTRUCTOR_SERVER_EXTENSIONS if not extensions[k]} == INSTRUCTOR_SERVER_EXTENSIONS
    else:
        assert not disabled & plugins
        assert all(extensions[k] for k in INSTRUCTOR_SERVER_EXTENSIONS)
    assert extensions["nbgrader.server_extensions.validate_assignment"]
    assert extensions["nbgrader.server_extensions.assignment_list"]
    assert extensions["jupyter_server_mathjax"]           # Formgrader's MathJax, served locally


def test_formgrader_page_loads_mathjax_from_the_server_not_a_cdn(tmp_path):
    """The template nbgrader's manual-grading page is made with, rendered with the instructor's
    config: MathJax's script is the server's /static/jupyter_server_mathjax/, no http(s) URL."""
    import nbformat
    from nbconvert.exporters import HTMLExporter
    from traitlets.config import Config

    import jupyter_server_mathjax

    from nbgrader.server_extensions.formgrader.handlers import template_path

    assert formgrader_template_dirs(ROOT)[1:] == [template_path]     # nbgrader's own, after the course's
    c = Config()
    c.HTMLExporter.template_name = "formgrade"                       # as nbgrader's Formgrader sets them
    c.HTMLExporter.extra_template_basedirs = formgrader_template_dirs(ROOT)
    assert instructor_config(ROOT).HTMLExporter.extra_template_basedirs == c.HTMLExporter.extra_template_basedirs
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(r"$\sqrt{d_k}$")])
    html, _ = HTMLExporter(config=c).from_notebook_node(nb, resources={
        "base_url": "/user/x", "index": 0, "total": 1, "notebook_id": "n", "assignment_id": "a",
        "submission_id": "0123abcd", "student": "s", "last_name": "", "first_name": "", "notebook_path": "n.ipynb"})
    scripts = re.findall(r"<script[^>]*src=\"([^\"]+)\"", html)
    mathjax = [s for s in scripts if "MathJax" in s]
    assert mathjax == ["../../../static/jupyter_server_mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"]
    # the page is <base_url>/formgrader/submissions/<id>/: three levels up is <base_url>/
    assert str(Path("/user/x/formgrader/submissions/0123abcd/" + mathjax[0].split("?")[0]).resolve()) == \
        "/user/x/static/jupyter_server_mathjax/MathJax.js"
    static = Path(jupyter_server_mathjax.__file__).parent / "static"
    assert (static / "MathJax.js").is_file() and (static / "config" / "TeX-AMS-MML_HTMLorMML-full.js").is_file()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "a remote script or style"
