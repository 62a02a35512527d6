"""False positives of the forbidden-API scan: honest code that mentions, resembles or computes
the same thing as a forbidden API scores no finding. Each case is checked twice: the scan of the
source alone, and the grader's whole static check with the code added to b01's reference
solution (a solution cell: its exercise's tests; a stray cell: every test). The hostile
counterparts are in test_scan_computed.py and test_parts.py."""
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.labspec import LabSpec
from autograder.course.reference import solution_cells, student_notebook
from autograder.grading.forbid import scan
from autograder.grading.program import build_program
from autograder.grading.static_check import banned_tests

B01 = Catalog.load().get("b01")
FORBID = list(B01.forbid)
SPEC = LabSpec.from_notebook(B01.source_path(repo_root()))
REF = solution_cells("b01")

HONEST = {
    "function_type_isinstance": "import types\nassert isinstance(softmax, types.FunctionType)\n",
    "function_type_imported": "from types import FunctionType, ModuleType\n"
                              "assert isinstance(softmax, (FunctionType, type)) and not isinstance(softmax, ModuleType)\n",
    "function_type_compared": "import types\nassert type(softmax) is types.FunctionType\n",
    "function_type_annotation": "import types\n\ndef describe(fn: types.FunctionType) -> str:\n    return fn.__name__\n",
    "function_type_union": "import types\nassert isinstance(softmax, types.FunctionType | types.BuiltinFunctionType)\n",
    "comments_docstrings_strings": '# torch.softmax and F.scaled_dot_product_attention are forbidden here\n'
                                   '"""I do not call torch.nn.functional.scaled_dot_product_attention."""\n'
                                   'note = "getattr(torch, \'soft\' + \'max\') would be refused"\nprint(note)\n',
    "einsum_attention": "import torch\nq = k = torch.randn(1, 2, 3, 4)\n"
                        "scores = torch.einsum('bhqd,bhkd->bhqk', q, k) / 2.0\n",
    "magics": "%matplotlib inline\n%time _ = softmax(torch.zeros(2))\n%timeit -n 1 -r 1 softmax(torch.zeros(2))\n%who\n",
    "cell_magic_time": "%%time\n_ = softmax(torch.zeros(3))\n",
    "crlf": "import torch\r\n\r\ndef my_softmax(x, dim=-1):\r\n    e = (x - x.amax(dim, keepdim=True)).exp()\r\n"
            "    return e / e.sum(dim, keepdim=True)\r\n",
    "own_attributes_by_name": "import torch\n\nclass Stack(torch.nn.Module):\n    def __init__(self, n):\n"
                              "        super().__init__()\n        for i in range(n):\n"
                              "            setattr(self, f'layer_{i}', torch.nn.Linear(2, 2))\n"
                              "    def forward(self, x):\n        for i in range(3):\n"
                              "            x = getattr(self, f'layer_{i}')(x)\n        return x\n",
    "opaque_names_on_own_objects": "def copy_fields(src, dst, names):\n    for name in names:\n"
                                   "        setattr(dst, name, getattr(src, name))\n",
    "private_attribute_by_suffix": "class Cache:\n    def __init__(self):\n        self._softmax = None\n"
                                   "    def get(self, name):\n        return getattr(self, '_' + name)\n"
                                   "    def dunder(self, op, x):\n        return getattr(x, f'__{op}__')()\n",
    "submodule_by_path": "def swap(model, path, new):\n    parent_name, _, child = path.rpartition('.')\n"
                         "    parent = model.get_submodule(parent_name)\n    old = getattr(parent, child)\n"
                         "    setattr(parent, child, new)\n    return old\n",
    "dtype_by_literal_name": "import torch\nx = torch.zeros(2).to(getattr(torch, 'float64'))\n",
    "library_settings": "import os\nimport torch\nimport matplotlib.pyplot as plt\n"
                        "torch.backends.cudnn.deterministic = True\ntorch.backends.cudnn.benchmark = False\n"
                        "plt.rcParams['figure.figsize'] = (6, 3)\nos.environ['TOKENIZERS_PARALLELISM'] = 'false'\n"
                        "torch.set_printoptions(precision=3)\n",
    "tensor_type_tests": "import torch\n\ndef f(x: torch.Tensor) -> torch.Tensor:\n"
                         "    assert isinstance(x, (torch.Tensor, float)) and type(x) is torch.Tensor\n    return x\n",
    "subclassing_library_classes": "import torch\n\nclass Block(torch.nn.Module):\n    def __init__(self):\n"
                                   "        super().__init__()\n        self.device = 'cpu'\n        self.proj = torch.nn.Linear(2, 2)\n",
    "config_fields": "from dataclasses import dataclass\n\n@dataclass\nclass Cfg:\n    d: int = 4\n\n"
                     "cfg = Cfg()\nfor k, v in vars(cfg).items():\n    print(k, getattr(cfg, k))\n",
    "functional_allowed_names": "import torch.nn.functional as F\nimport torch\ny = F.gelu(torch.zeros(2)) + F.relu(torch.zeros(2))\n",
    "cudnn_and_sparse_attributes": "import torch\nprint(torch.backends.cudnn.is_available(), torch.sparse.mm)\n",
    "globals_by_literal_name": "fn = globals()['softmax']\n",
    "another_librarys_own_function": "import numpy as np\nimport scipy.special\n"
                                     "p = scipy.special.softmax(np.zeros(3))\nf = getattr(np, dtype_name)\n",
    "exploring_a_module_and_own_attributes": "import torch\nimport torch.nn.functional as F\nprint(dir(F)[:3])\n"
                                             "help(torch.tril)\n\nclass Cfg:\n    def __init__(self, device):\n"
                                             "        self.device = device\n\ndef set_all(obj, names, value):\n"
                                             "    for n in names:\n        setattr(obj, n, value)\n        obj.dtype = value\n",
    "writes_data_and_optional_import": "import json\nfrom pathlib import Path\ntry:\n    import wandb_not_installed\n"
                                       "except ImportError:\n    wandb_not_installed = None\n"
                                       "with open('results.json', 'w') as f:\n    json.dump({'ok': 1}, f)\n"
                                       "Path('notes.txt').write_text('done')\n",
}


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_code_scores_no_finding(name):
    assert scan(HONEST[name], FORBID) == ([], [])


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_code_costs_no_test_when_graded(tmp_path, name):
    nb = student_notebook("b01", {"softmax": REF["softmax"] + "\n\n" + HONEST[name].replace("\r\n", "\n")
                                  if "%" not in HONEST[name] else REF["softmax"]})
    if "%" in HONEST[name]:       # magics go in a cell of their own, as a student writes them
        import nbformat
        i = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
        nb.cells.insert(i + 1, nbformat.v4.new_code_cell(HONEST[name]))
    assert banned_tests(SPEC, build_program(SPEC, nb).cells, FORBID, tmp_path) == {}


def test_an_honest_helper_file_with_crlf_line_endings_costs_nothing(tmp_path):
    (tmp_path / "mine.py").write_bytes(HONEST["crlf"].encode())
    nb = student_notebook("b01")
    assert banned_tests(SPEC, build_program(SPEC, nb).cells, FORBID, tmp_path) == {}
