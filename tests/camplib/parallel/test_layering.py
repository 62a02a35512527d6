"""Library code never imports the runners that exercise it (camplib.dist.on_ranks's callers):
a runner is test/grader/demo code, and a library module that imported one would drag it into
every user of the library (and, for a forbidden package, into a student's calls)."""
import ast
from pathlib import Path

import pytest

import camplib

ROOT = Path(camplib.__file__).parent
RUNNERS = {"camplib.dist.harness", "camplib.parallel.data.run", "camplib.parallel.zero.run",
           "camplib.parallel.data.compression_run", "camplib.parallel.tensor.run", "camplib.parallel.pipeline.run",
           "camplib.parallel.context.run", "camplib.parallel.hybrid.run", "camplib.parallel.pipeline.bubble"}
LIBRARY = ["dist/launch.py", "dist/ring.py", "dist/counting.py", "dist/ranks.py", "parallel/__init__.py",
           "parallel/data/wrapper.py", "parallel/zero/optimizer.py", "parallel/zero/memory.py", "parallel/data/compression.py",
           "parallel/model_specs.py", "parallel/reference.py",
           "parallel/tensor/layers.py", "parallel/tensor/comm.py", "parallel/tensor/model.py",
           "parallel/pipeline/stages.py", "parallel/pipeline/comm.py", "parallel/pipeline/schedule.py",
           "parallel/mesh.py", "parallel/context/ring.py", "parallel/hybrid/trainer.py", "parallel/dist_checkpoint.py"]


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

