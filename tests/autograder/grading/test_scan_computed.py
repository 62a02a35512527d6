"""The static scan is deny by default for names computed at run time on modules and classes that
carry forbidden APIs, and every write into a library module is tampering: one case per way of
computing a name or reaching a module, each with the reason it is refused and the line it names.
The honest counterparts are in test_scan_honest.py. b01's forbid list (course/labs.toml)."""
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.labspec import LabSpec
from autograder.course.reference import student_notebook
from autograder.grading.forbid import check, scan, static_uses
from autograder.grading.program import build_program
from autograder.grading.static_check import banned_tests

B01 = Catalog.load().get("b01")
FORBID = list(B01.forbid)
TORCH = [e for e in FORBID if e.startswith("torch")]
SOFTMAX = FORBID[3:6]
PRELUDE = "import torch\nimport torch.nn.functional as F\nimport camplib\n"


@pytest.mark.parametrize("source, expected", [
    # names folded from literals are literals
    ("f = getattr(F, ''.join(['scaled_dot_', 'product_attention']))", FORBID[:1]),
    ("f = getattr(torch, ''.join(reversed('xamtfos')))", SOFTMAX),
    ("f = getattr(torch, chr(115) + 'oftmax')", SOFTMAX),
    ("f = getattr(torch, '%smax' % 'soft')", SOFTMAX),
    ("f = getattr(torch, '{}max'.format('soft'))", SOFTMAX),
    ("f = getattr(torch, 'SOFTMAX'.lower())", SOFTMAX),
    ("n = 'soft'\nn2 = n + 'max'\nf = getattr(torch, n2)", SOFTMAX),
    ("m = importlib.import_module('torch.nn.' + 'functional')\nf = m.scaled_dot_product_attention", FORBID[:1]),
    # a name known only at run time, on a module or class carrying forbidden entries: any of them
    ("f = getattr(F, name)", TORCH),
    ("f = getattr(F, f'{a}_attention')", TORCH),
    ("f = getattr(torch.Tensor, name)", TORCH),
    ("f = hasattr(torch.nn, name) and 1", TORCH),
    ("f = vars(F)[name]", TORCH),
    ("f = F.__dict__.get(name)", TORCH),
    ("f = getattr(camplib, name)", FORBID[2:3]),
    ("m = __import__('torch.nn.functional', fromlist=['x'])\nf = getattr(m, name)", TORCH),
    ("f = getattr(__import__('torch'), name)", TORCH),
    ("f = getattr(globals()['F'], name)", TORCH),
    # the module reached through a container, a conditional or a loop
    ("mods = [F]\nf = getattr(mods[0], name)", TORCH),
    ("m = F if flag else None\nf = getattr(m, name)", TORCH),
    ("for m in (torch, F):\n    f = getattr(m, name)", TORCH),
    ("ms = {'f': F}\nf = getattr(ms['f'], name)", TORCH),
    ("f = getattr(*[F, name])", TORCH),
    ("args = (F, name)\nf = getattr(*args)", TORCH),
    # the module reached through another package's attributes
    ("import camplib.activation_checkpoint as C\nf = getattr(C.torch.nn.functional, name)", FORBID),
    ("import transformers.modeling_utils as mu\nf = mu.nn.functional.scaled_dot_product_attention", FORBID[:1]),
    ("import transformers.modeling_utils as mu\nf = getattr(mu, name)", TORCH),
    # an object the scan cannot type, with a name partly built from literals that could spell one
    ("def softmax(x, dim=-1):\n    return getattr(x, 'soft' + suffix)(dim)", SOFTMAX),
    ("def softmax(x, dim=-1):\n    return getattr(x, f'_{kind}softmax')(dim)", SOFTMAX),
])
def test_a_computed_name_on_a_carrier_is_denied(source, expected):
    assert static_uses("import importlib\n" + PRELUDE + source, FORBID) == expected


@pytest.mark.parametrize("source, fragment", [
    ("import operator\nf = operator.attrgetter(name)(F)", "operator.attrgetter() with a computed name"),
    ("import functools\nf = functools.reduce(getattr, ['nn', 'functional', 'softmax'], torch)", "hands getattr around"),
    ("from functools import partial\ng = partial(getattr, torch)", "hands getattr around"),
    ("g = getattr\nf = g(torch, name)", "hands getattr around"),
    ("import operator\nf = list(map(operator.attrgetter, names))", "hands operator.attrgetter around"),
    ("m = importlib.import_module(name)", "import_module() on a computed value"),
    ("import types\nf = getattr(types, name)", "computed names"),
    ("import sys\nm = vars(sys)[name]", "computed names"),
    ("f = F.__loader__", "__loader__"),
])
def test_indirect_lookups_are_findings(source, fragment):
    hits, findings = scan("import importlib\n" + PRELUDE + source, FORBID)
    assert any(fragment in f for f in findings), (hits, findings)


@pytest.mark.parametrize("source, fragment", [
    ("import camplib.dist.harness as h\nh.run_collective = fake", "assigns to camplib.dist.harness.run_collective"),
    ("from camplib.dist import harness\nsetattr(harness, 'run_collective', fake)", "replaces camplib.dist.harness.run_collective"),
    ("m = __import__('camplib.dist.harness', fromlist=['x'])\nm.run_collective = fake", "camplib.dist.harness.run_collective"),
    ("m = [__import__('camplib.dist.harness', fromlist=['x'])][0]\nm.run_collective = fake", "camplib.dist.harness.run_collective"),
    ("torch.Tensor.softmax = mine", "assigns to torch.Tensor.softmax"),
    ("setattr(torch.nn.functional, name, fake)", "replaces torch.nn.functional.<computed name>"),
    ("setattr(F, 'gelu', fake)", "replaces torch.nn.functional.gelu"),
    ("del F.gelu", "torch.nn.functional.gelu"),
    ("delattr(torch, 'tril')", "deletes torch.tril"),
    ("F.__dict__['softmax'] = fake", "torch.nn.functional[...]"),
    ("vars(F).update(softmax=fake)", "changes the namespace of torch.nn.functional"),
    ("import camplib.dist.harness as h\nh.__dict__.update(run_collective=fake)", "changes the namespace of camplib.dist.harness"),
    ("object.__setattr__(F, 'softmax', fake)", "__setattr__ on torch.nn.functional"),
    ("torch.nn.Linear.forward = fwd", "assigns to torch.nn.Linear.forward"),
    ("torch.allclose = lambda *a, **k: True", "assigns to torch.allclose"),
    ("import numpy\nnumpy.allclose = lambda *a, **k: True", "assigns to numpy.allclose"),
    ("torch.tril += 1", "assigns to torch.tril"),
    ("torch.Tensor.__array_priority__ = 1000", "assigns to torch.Tensor.__array_priority__"),
    ("from unittest import mock\nmock.patch('camplib.dist.harness.run_collective', fake).start()", "unittest.mock.patch"),
    ("import unittest.mock as um\num.patch.object(F, 'softmax', fake).start()", "unittest.mock.patch"),
    ("import operator\nimport camplib.dist.harness as h\noperator.setitem(vars(h), 'run_collective', fake)",
     "namespace of camplib.dist.harness"),
    ("import camplib.dist.harness as h\nns = h.__dict__\nns['run_collective'] = fake", "namespace of camplib.dist.harness"),
])
def test_writes_into_library_modules_are_tampering(source, fragment):
    hits, findings = scan(PRELUDE + source, FORBID)
    assert any(fragment in f and "tampering" in f for f in findings), (hits, findings)


SPEC = LabSpec.from_notebook(B01.source_path(repo_root()))
ALL = sorted(t.grade_id for t in SPEC.tests)


def _banned(tmp_path, **cells):
    nb = student_notebook("b01", cells)
    return banned_tests(SPEC, build_program(SPEC, nb).cells, FORBID, tmp_path)


def test_a_module_handed_to_a_helper_makes_its_opaque_lookups_count(tmp_path):
    """`getattr(m, n)` inside a helper is innocent by itself (honest code looks attributes up on
    its own objects that way); once a module carrying forbidden entries is handed to code the
    scan cannot follow, such a lookup could be on it."""
    helper = "import torch\n\ndef _pick(m, n):\n    return getattr(m, n)\n\n"
    honest = _banned(tmp_path, softmax=helper + _reference("softmax"))
    assert honest == {}
    hostile = _banned(tmp_path, softmax=helper + "def softmax(x, dim=-1):\n    return _pick(torch, 'soft' + 'max')(x, dim)\n")
    assert sorted(hostile) == ["test_mha", "test_sdpa", "test_softmax"]
    why = hostile["test_softmax"]
    assert "line 4" in why and "getattr(m, n)" in why and "could be torch" in why and "line 7" in why, why


def test_a_module_handed_to_a_helper_that_writes_into_it_is_tampering(tmp_path):
    patch = "import camplib.dist.harness\n\ndef _patch(m):\n    m.run_collective = print\n\n_patch(camplib.dist.harness)\n"
    banned = _banned(tmp_path, softmax=_reference("softmax") + "\n" + patch)
    assert sorted(banned) == ALL
    assert "assigns to camplib.dist.harness.run_collective" in banned["test_masks"] and "tampering" in banned["test_masks"]


def test_a_module_kept_as_a_class_attribute_counts_as_handed_away(tmp_path):
    keep = "import torch\n\nclass _Box:\n    mod = torch\n\n_f = getattr(_Box.mod, kind)\n"
    banned = _banned(tmp_path, softmax=_reference("softmax") + "\n" + keep)
    assert sorted(banned) == ["test_mha", "test_sdpa", "test_softmax"] and "could be torch" in banned["test_softmax"]


@pytest.mark.parametrize("write", [
    "with open('fast_softmax.py', 'w') as f:\n    f.write(CODE)\n",
    "from pathlib import Path\nPath('fast_softmax.py').write_text(CODE)\n",
    "open(name + '.py', 'a').write(CODE)\n",
    "import shutil\nshutil.copy('notes.txt', 'fast_softmax.py')\n",
])
def test_code_written_at_run_time_then_imported_costs_every_test(tmp_path, write):
    """The scan reads the files the submission holds; a module the notebook writes while it runs
    and then imports is code it never saw."""
    code = "CODE = 'import torch\\ndef softmax(x, dim=-1):\\n    return torch.softmax(x, dim)\\n'\n"
    banned = _banned(tmp_path, softmax=code + write + "from fast_softmax import softmax\n")
    assert sorted(banned) == ALL
    assert "imports fast_softmax, which is neither installed nor a file of the submission" in banned["test_mha"]
    assert "writes a file at run time" in banned["test_mha"]
    (tmp_path / "fast_softmax.py").write_text("def softmax(x, dim=-1):\n    return x\n")   # submitted: scanned
    assert _banned(tmp_path, softmax="from fast_softmax import softmax\nopen('log.txt', 'w').write('x')\n") == {}


def test_the_reason_names_the_cell_and_the_line(tmp_path):
    source = _reference("softmax") + "\nimport torch.nn.functional as _F\n_f = getattr(_F, 'scaled_' + kind)\n"
    banned = _banned(tmp_path, softmax=source)
    line = source.splitlines().index("_f = getattr(_F, 'scaled_' + kind)") + 1
    assert f"line {line}: getattr(_F, 'scaled_' + kind) looks up an attribute of torch.nn.functional by a name " \
           "computed at run time" in banned["test_softmax"], banned["test_softmax"]
    tamper = _reference("softmax") + "\nimport camplib.dist.harness as _h\n_h.run_collective = print\n"
    banned = _banned(tmp_path, softmax=tamper)
    line = tamper.splitlines().index("_h.run_collective = print") + 1
    assert sorted(banned) == ALL and f", line {line}: assigns to camplib.dist.harness.run_collective" in banned["test_mha"]


def test_check_reports_lines_of_findings():
    result = check("import torch\n\nx = 1\ntorch.tril = print\n", FORBID)
    assert result.lines[result.findings[0]] == 4


def _reference(name):
    from autograder.course.reference import solution_cells
    return solution_cells("b01")[name]
