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
from autograder.course.nbgrader_setup import (
    COURSE_ID,
    formgrader_template_dirs,
    instructor_config,
    main,
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


def _released_listings(api) -> int:
    """How many times Formgrader's assignment list makes nbgrader log "Released assignments"."""
    seen = []

    class Count(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Count(level=logging.INFO)
    api.log.addHandler(handler)
    old = api.log.level
    api.log.setLevel(logging.INFO)
    try:
        api.get_assignments()
    finally:
        api.log.removeHandler(handler)
        api.log.setLevel(old)
    return sum(m == "Released assignments:" for m in seen)


def test_instructor_releases_every_ready_lab_once_and_formgrader_says_released(workspace):
    _, exchange = workspace
    api = nbgrader_api(instructor_config(ROOT))
    assert {a["name"]: a["status"] for a in api.get_assignments()}[READY[0]] == "draft"
    assert _released_listings(api) == len(READY) + 1   # nbgrader lists the exchange again per lab
    assert release_ready_labs(ROOT) == (READY, "")
    assert release_ready_labs(ROOT) == ([], "")          # what is already there stays as it is
    outbound = exchange / COURSE_ID / "outbound"
    assert sorted(p.name for p in outbound.iterdir()) == sorted(READY)
    for name in READY:
        assert (outbound / name / f"{name}.ipynb").read_bytes() == (ROOT / "labs" / name / f"{name}.ipynb").read_bytes()
    assert {a["status"] for a in api.get_assignments()} == {"released"}
    assert _released_listings(api) == 1


def test_make_lab_releases_for_an_instructor_only(workspace, capsys):
    _, exchange = workspace
    assert main(["--role", "student"]) == 0
    assert not any((exchange / COURSE_ID / "outbound").iterdir())
    assert "ROLE=instructor" in capsys.readouterr().out
    assert main(["--role", "instructor"]) == 0
    assert sorted(p.name for p in (exchange / COURSE_ID / "outbound").iterdir()) == sorted(READY)
    assert f"released {len(READY)} ready labs" in capsys.readouterr().out


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
