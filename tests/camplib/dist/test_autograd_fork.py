"""camplib.dist and autograd's threads: on a machine with a GPU, a process that ran backward can no
longer fork ranks that run backward (labs a02 and a03 failed so on an H200). Reproduced on this
CPU with tests/fake_accelerator.py, always in a fresh interpreter (this test process stays
unmarked, and its own engine has long decided); `in_child` keeps the launching process free of autograd."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from camplib.dist import RankError, in_child, launch
from tests import fake_accelerator


def _scaled(x, k=1.0):
    print("computing in the child")
    return {"y": x * k, "pid_differs": __import__("os").getpid()}


def test_in_child_returns_the_value_untagged_prints_and_the_error(capsys):
    import os
    out = in_child(_scaled, torch.arange(3.0), k=2.0)
    assert torch.equal(out["y"], torch.tensor([0.0, 2.0, 4.0])) and out["pid_differs"] != os.getpid()
    assert capsys.readouterr().out == "computing in the child\n"
    with pytest.raises(RankError, match="ValueError: no such shape"):
        in_child(lambda: (_ for _ in ()).throw(ValueError("no such shape")))


def _grad_of_square(x):
    x = x.clone().requires_grad_(True)
    (x * x).sum().backward()
    return x.grad


def _rank_grads(rank, world_size, x):
    g = _grad_of_square(x[rank::world_size])
    dist.all_reduce(g)
    return g


def _backward_here_then_ranks(accelerator, reference_in_child):
    """In a fresh child of the test: the a02/a03 flow (a reference gradient, then ranks that run
    backward); what the ranks returned, or the error launch raised."""
    if accelerator:
        fake_accelerator.register()
    x = torch.arange(4.0)
    expected = in_child(_grad_of_square, x) if reference_in_child else _grad_of_square(x)
    try:
        grads = launch(_rank_grads, 2, x, timeout=30)
    except RankError as exc:
        return str(exc)
    return [torch.equal(g, expected[0::2] + expected[1::2]) for g in grads]


def _in_a_fresh_interpreter(accelerator, reference_in_child):
    """_backward_here_then_ranks in a new Python process. Not a fork of this worker: torch's engine
    decides once per process, at its first backward, whether to mark later forks, and a pytest
    worker has run backward long before (its decision, made with no accelerator, is inherited by
    every fork of it)."""
    code = ("import json, sys\n"
            "from tests.camplib.dist.test_autograd_fork import _backward_here_then_ranks\n"
            f"out = _backward_here_then_ranks({accelerator}, {reference_in_child})\n"
            "sys.stdout.write('\\nRESULT ' + json.dumps(out))\n")
    root = Path(__file__).resolve().parents[3]
    run = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])})
    assert run.returncode == 0 and "\nRESULT " in run.stdout, f"the child failed (exit {run.returncode}): {run.stderr[-2000:]}"
    return json.loads(run.stdout.rsplit("\nRESULT ", 1)[1])


def test_backward_before_forking_ranks_fails_as_on_a_gpu_and_says_why():
    """The control (a CPU-only torch) passes; counting one accelerator, ranks forked after a
    backward here fail with torch's error and launch's explanation."""
    assert _in_a_fresh_interpreter(False, False) == [True, True]
    error = _in_a_fresh_interpreter(True, False)
    assert isinstance(error, str), error
    assert "Unable to handle autograd's threading in combination with fork-based multiprocessing" in error
    assert "camplib.dist.in_child(fn, *args)" in error and "restart the kernel" in error


def test_a_reference_computed_in_a_child_leaves_the_process_able_to_fork_ranks():
    assert _in_a_fresh_interpreter(True, True) == [True, True]
