"""Library code never imports the runners that exercise it (camplib.dist.on_ranks's callers):
a runner is test/grader/demo code, and a library module that imported one would drag it into
every user of the library (and, for a forbidden package, into a student's calls)."""
import ast
from pathlib import Path

import pytest

import camplib

ROOT = Path(camplib.__file__).parent
RUNNERS = {"camplib.dist.harness", "camplib.parallel.train_ranks", "camplib.parallel.zero_run",
           "camplib.parallel.compression_run", "camplib.parallel.tensor_run", "camplib.parallel.pipeline_run",
           "camplib.parallel.context_run", "camplib.parallel.hybrid_run", "camplib.parallel.pipeline_bubble"}
LIBRARY = ["dist/launch.py", "dist/ring.py", "dist/counting.py", "dist/ranks.py", "parallel/__init__.py",
           "parallel/data_parallel.py", "parallel/zero.py", "parallel/zero_memory.py", "parallel/compression.py",
           "parallel/model_specs.py", "parallel/reference.py",
           "parallel/tensor.py", "parallel/tensor_comm.py", "parallel/tensor_model.py",
           "parallel/pipeline.py", "parallel/pipeline_comm.py", "parallel/pipeline_schedule.py",
           "parallel/mesh.py", "parallel/context.py", "parallel/hybrid.py", "parallel/dist_checkpoint.py"]


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules a file imports (relative imports resolved), anywhere in it."""
    package = ".".join(("camplib",) + path.relative_to(ROOT).parent.parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = (base + "." + node.module if node.module else base) if node.level else node.module
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


@pytest.mark.parametrize("relative", LIBRARY)
def test_library_module_imports_no_runner(relative):
    runners = sorted(imported_modules(ROOT / relative) & RUNNERS)
    assert runners == [], f"camplib/{relative} imports the runner(s) {runners}"

