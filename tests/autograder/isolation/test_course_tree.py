"""A lab's sandbox holds camplib without the modules the lab forbids by name: which modules
(course_tree, from the catalog and the lab's source notebook) and, inside a real bwrap sandbox,
that they are gone (no file, no import, no compiled copy) while the rest still imports."""
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.grading.remote import Session
from autograder.isolation import course_tree
from autograder.isolation.sandbox import Sandbox, namespaces_available, sandbox_problem

ROOT = repo_root()
CATALOG = Catalog.load()
UID = 61980


def hidden(lab_id):
    lab = CATALOG.get(lab_id)
    return course_tree.hidden_modules(lab.forbid, lab.source_path(ROOT), lab.notes)


def test_each_lab_leaves_out_the_camplib_modules_it_forbids():
    assert hidden("b01") == ("camplib.attention",)
    assert set(hidden("b04")) == {"camplib.optim", "camplib.schedule", "camplib.trainer", "camplib.train_state"}
    # b06's runners live in camplib.dist and camplib.parallel, which stay
    assert set(hidden("b06")) == {"camplib.parallel.data.wrapper", "camplib.parallel.zero.optimizer",
                                  "camplib.parallel.data.compression", "camplib.dist.ring"}
    assert {m for m in hidden("a09") if not m.startswith("camplib.kernels.")} == {"camplib.kernels"}


def test_what_a_labs_notes_allow_stays_with_what_it_imports():
    """a07 lets students use `camplib.quant.layers`, which imports the formats the lab forbids:
    leaving them out would make an honest import fail."""
    assert hidden("a07") == ()
    # a08's notes name its answers as not the student's: they are left out
    assert set(hidden("a08")) == {"camplib.compress.pruning", "camplib.compress.distill", "camplib.compress.vocabulary"}
    lab = CATALOG.get("a07")
    assert {"camplib.quant.formats", "camplib.quant.nf4"} <= set(course_tree.exposed(lab.forbid, lab.source_path(ROOT), lab.notes))
    assert course_tree.named_modules("`camplib.model.GPT` and `camplib.rope` are yours") == \
        {"camplib", "camplib.model", "camplib.rope"}


@pytest.mark.parametrize("lab", [lab for lab in CATALOG.ready() if course_tree.forbidden_modules(lab.forbid)],
                         ids=lambda lab: lab.id)
def test_what_the_course_runs_in_the_sandbox_still_imports(lab):
    """Nothing the lab's course cells import, its tests `make` or its notes allow needs a module
    left out; the forbidden modules that stay are exactly those."""
    source = lab.source_path(ROOT)
    kept = course_tree.kept_modules(lab.forbid, source, lab.notes)
    allowed = course_tree.named_modules(lab.notes) - course_tree.forbidden_modules(lab.forbid)
    assert course_tree.course_needs(str(source)) | allowed <= kept
    left_out = set(course_tree.hidden_modules(lab.forbid, source, lab.notes))
    assert not kept & left_out
    assert left_out | set(course_tree.exposed(lab.forbid, source, lab.notes)) == course_tree.forbidden_modules(lab.forbid)
    for module in kept:   # module-level imports of what stays never reach a module left out
        assert not course_tree.module_graph()[module] & left_out, module


def test_forbidden_module_entries_and_others():
    graph = course_tree.module_graph()
    assert "camplib.parallel" in graph["camplib.parallel.data.run"]        # parents count
    assert "camplib.parallel.data.wrapper" not in graph["camplib.parallel"]  # lazy re-export
    # a class name or a function under a module is not a module: the observer's job, not the tree's
    assert course_tree.forbidden_modules(["camplib.parallel.DataParallel", "camplib.attention.attend",
                                          "torch.nn.functional.softmax"]) == set()
    assert course_tree.forbidden_modules(["camplib.kernels"]) >= {"camplib.kernels", "camplib.kernels.flash"}


def test_no_module_hidden_no_change():
    assert course_tree.bwrap_binds(()) == []


PROBE = r'''
import importlib, os, sys
import camplib
root = os.path.dirname(camplib.__file__)
def try_import(name):
    sys.modules.pop(name, None)
    try:
        importlib.import_module(name)
        return "imported"
    except ImportError as exc:
        return type(exc).__name__
def try_read(path):
    try:
        with open(path) as f:
            return f.read()[:10]
    except OSError as exc:
        return exc.errno
found = {
    "attention": try_import("camplib.attention"),
    "read": try_read(os.path.join(root, "attention.py")),
    "listed": sorted(os.listdir(root)),
    "cache": sorted(n for n in os.listdir(os.path.join(root, "__pycache__"))) if os.path.isdir(os.path.join(root, "__pycache__")) else [],
    "rope": try_import("camplib.rope"),
    "parallel": try_import("camplib.parallel.data.run"),
    "model": try_import("camplib.model"),
    "writable": os.access(root, os.W_OK),
}
'''


@pytest.mark.skipif(not namespaces_available(), reason=f"bwrap sandbox unavailable: {sandbox_problem()}")
def test_b01_sandbox_cannot_read_or_import_camplib_attention(tmp_path):
    staging = tmp_path / "in"
    staging.mkdir()
    sandbox = Sandbox(staging, isolation="bwrap", uid=UID, hide=hidden("b01"))
    sandbox.start()
    try:
        session = Session(sandbox)
        assert session.request("exec", "probe", source=PROBE) is None
        found = session.request("getattr", "probe", target="found", name="copy")()
    finally:
        sandbox.close()
    assert found["attention"] == "ModuleNotFoundError"
    assert found["read"] == 2                                   # ENOENT: no file to read or copy
    assert "attention.py" not in found["listed"] and "rope.py" in found["listed"]
    assert not any(n.startswith("attention.") for n in found["cache"])
    assert found["rope"] == "imported" and found["parallel"] == "imported"
    assert found["model"] == "ModuleNotFoundError"              # it needs attention: gone with it
    assert found["writable"] is False
