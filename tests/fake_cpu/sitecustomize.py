"""Makes this process, and every Python process started with this folder on PYTHONPATH, see a CPU
with the feature flags named in $CAMP_FAKE_CPU, as far as the course's dependencies ask.

Libraries take code paths by CPU feature, and the machines the suite runs on may lack the flags a
class's laptops or cloud machines have. `CAMP_FAKE_CPU=avx512bf16 make test` runs the whole suite
(tests/conftest.py puts this folder on PYTHONPATH, so notebook kernels and the grader inherit
it; the grading sandbox does not: its environment is its own) as on a CPU with AVX512-BF16; tests/autograder/test_dependency_logs.py runs a lab's
imports both ways on any machine.

- `avx512bf16`: bitsandbytes' `has_avx512bf16()` (its native probe) answers True, from the moment
  `bitsandbytes.functional` is loaded, so its CPU backend takes that path as it is imported (it
  then registers bf16 kernels: importing is safe on any CPU, calling its 4-bit GEMV would need the
  real instructions; no test calls it).
"""
import importlib.abc
import importlib.machinery
import os
import sys

FLAGS = {f for f in os.environ.get("CAMP_FAKE_CPU", "").replace(",", " ").split() if f}
KNOWN = {"avx512bf16"}


class _ForceAvx512Bf16(importlib.abc.MetaPathFinder):
    """Patches bitsandbytes.functional right after it executes, before anything imports from it."""

    def find_spec(self, name, path, target=None):
        if name != "bitsandbytes.functional":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module.has_avx512bf16 = lambda: True

        spec.loader.exec_module = exec_module
        return spec


if FLAGS - KNOWN:
    raise SystemExit(f"CAMP_FAKE_CPU: unknown flags {sorted(FLAGS - KNOWN)}; known: {sorted(KNOWN)}")
if "avx512bf16" in FLAGS:
    if "bitsandbytes" in sys.modules:
        raise SystemExit("CAMP_FAKE_CPU=avx512bf16: bitsandbytes was imported before the CPU could be faked")
    sys.meta_path.insert(0, _ForceAvx512Bf16())
