"""The two ways to install (pip/pyproject and conda/environment.yml) ask for the same things."""
import sys
from pathlib import Path

import pytest
import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml needs exactly one pip: section"
    listed = {p for p in pip_sections[0] if not p.startswith("-e")}
    assert listed == wanted, (f"only in environment.yml: {sorted(listed - wanted)}; "
                              f"only in pyproject.toml: {sorted(wanted - listed)}")
    python = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")]
    assert python == ["python" + project["requires-python"]], \
        f"environment.yml asks for {python}, pyproject.toml for python{project['requires-python']}"


def test_supported_pythons_are_310_to_313():
    """torch 2.13, nbgrader and JupyterLab 4 support 3.10-3.13; the code may not need more
    (tomllib, 3.11+, comes from tomli below 3.11)."""
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    spec = SpecifierSet(project["requires-python"])
    assert [v for v in ("3.9", "3.10", "3.11", "3.12", "3.13", "3.14") if v in spec] == \
        ["3.10", "3.11", "3.12", "3.13"], spec
    assert 'tomli>=2; python_version < "3.11"' in project["dependencies"]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make lab" in readme
    assert ci.strip().splitlines()[-1] == "make test"


def test_jupyterlab_has_the_nbgrader_and_widgets_extensions():
    import subprocess
    import sys
    from pathlib import Path
    jupyter = Path(sys.executable).parent / "jupyter"
    out = subprocess.run([str(jupyter), "labextension", "list"], capture_output=True, text=True, timeout=120)
    listing = out.stdout + out.stderr
    for ext in ("@jupyter/nbgrader", "@jupyter-widgets/jupyterlab-manager"):
        line = next((l for l in listing.splitlines() if ext in l), "")
        assert "enabled" in line and "OK" in line, f"{ext} is not installed and enabled:\n{listing}"


def test_constraints_pin_every_dependency_within_its_range():
    """constraints.txt (what `make setup` installs) pins each dependency of pyproject.toml to one
    version that pyproject's own range admits, all on one Python: the lock and the ranges cannot
    drift apart unnoticed."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins, pythons = {}, set()
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(req.name)] = spec.version
            pythons.add(str(req.marker))
    assert len(pythons) == 1 and next(iter(pythons)).startswith('python_version == "'), pythons
    python = next(iter(pythons)).split('"')[1]
    problems = []
    for text in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        req = Requirement(text)
        if req.marker and not req.marker.evaluate({"python_version": python, "sys_platform": "linux"}):
            continue
        version = pins.get(canonicalize_name(req.name))
        if version is None or version not in req.specifier:
            problems.append(f"{text}: constraints.txt has {version}")
    assert not problems, "run `make constraints` in a venv that passes `make test`:\n" + "\n".join(problems)


# What a06's cells do: the setup cell imports autograder.checks, a test cell imports peft; then
# whether bitsandbytes' CPU backend saw AVX512-BF16 and whether the optional `kernels` exists.
LAB_IMPORTS = """
import autograder.checks
import transformers, peft
import importlib.util, bitsandbytes.functional
print(bool(bitsandbytes.functional.has_avx512bf16()), importlib.util.find_spec("kernels") is not None)
"""


@pytest.mark.parametrize("cpu", ["this machine's", "avx512bf16"])
def test_importing_transformers_and_peft_prints_nothing(cpu, tmp_path):
    """A lab cell that imports peft or loads a model must write nothing to stderr (nbgrader scores
    such a cell 0), whatever the CPU. transformers and peft import torchao whenever it can be
    imported, and torchao prints as it loads: reference-only packages (the Makefile's
    REFERENCE_WHEELS) live off sys.path. `import peft` imports bitsandbytes, whose CPU backend logs
    that the optional `kernels` package is missing on a CPU with AVX512-BF16: run both ways here
    (tests/fake_cpu forces that path), its record lands in the course log
    (autograder.dependency_logs)."""
    import importlib.util
    import os
    import subprocess

    assert importlib.util.find_spec("torchao") is None, "torchao is importable in the course's venv"
    env = dict(os.environ, CAMP_LOG=str(tmp_path / "course.log"), CAMP_FAKE_CPU="")
    if cpu == "avx512bf16":
        env.update(CAMP_FAKE_CPU=cpu, PYTHONPATH=os.pathsep.join(filter(None, [
            str(ROOT / "tests" / "fake_cpu"), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", LAB_IMPORTS], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env=env)
    assert out.returncode == 0 and out.stderr == "", out.stderr[-3000:]
    has_bf16, has_kernels = (word == "True" for word in out.stdout.split()[-2:])
    if cpu == "avx512bf16":
        assert has_bf16, "tests/fake_cpu did not make bitsandbytes see AVX512-BF16"
    log = (tmp_path / "course.log").read_text() if (tmp_path / "course.log").exists() else ""
    assert ("gemm_4bit_forward" in log) == (has_bf16 and not has_kernels), log


def test_makefile_pins_the_reference_only_torchao():
    """`pip freeze` (and so constraints.txt) cannot see a --target folder: the Makefile pins it, and
    the side-by-side test expects that version."""
    from tests.camplib.quant.test_torchao_side_by_side import TORCHAO_VERSION

    makefile = (ROOT / "Makefile").read_text()
    assert f"REFERENCE_WHEELS = torchao=={TORCHAO_VERSION}\n" in makefile
    assert "torchao" not in (ROOT / "constraints.txt").read_text()
