"""camplib.dist and autograd's threads: on a machine with a GPU, a process that ran backward can no
longer fork ranks that run backward (labs a02 and a03 failed so on an H200). Reproduced on this
CPU with tests/fake_accelerator.py, always inside a forked child so that this test process stays
unmarked; `in_child` keeps the launching process free of autograd."""
import multiprocessing as mp

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


def _in_a_child(fn, *args):
    """fn(*args) in a forked child that may fork (in_child's child is daemonic: it may not)."""
    ctx = mp.get_context("fork")
    queue = ctx.SimpleQueue()
    child = ctx.Process(target=lambda: queue.put(fn(*args)))
    child.start()
    try:
        return queue.get()
    finally:
        child.join(30)


def test_backward_before_forking_ranks_fails_as_on_a_gpu_and_says_why():
    """The control (a CPU-only torch) passes; counting one accelerator, ranks forked after a
    backward here fail with torch's error and launch's explanation."""
    assert _in_a_child(_backward_here_then_ranks, False, False) == [True, True]
    error = _in_a_child(_backward_here_then_ranks, True, False)
    assert isinstance(error, str), error
    assert "Unable to handle autograd's threading in combination with fork-based multiprocessing" in error
    assert "camplib.dist.in_child(fn, *args)" in error and "restart the kernel" in error


def test_a_reference_computed_in_a_child_leaves_the_process_able_to_fork_ranks():
    assert _in_a_child(_backward_here_then_ranks, True, True) == [True, True]
