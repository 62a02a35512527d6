"""Distributed labs: the course's runners (camplib.dist.harness, camplib.parallel.data.run,
zero.run, context.run) run in the student's process, so what they report is the student's answer,
never evidence. Submissions with blank exercises replace those runners with fakes that compute
every answer in one process, report the bytes and calls a ring, DataParallel or ZeRO would have
produced, and put junk of that size on the loopback network (so a byte lower bound alone is met):
from a notebook cell through names computed at run time, and from a .py file beside the notebook.

Every such test now runs on ranks the grader starts, each in a sandbox of its own that holds only
its own input (autograder.grading.rank_pool): a fake runner is never called there, and a fake
rank function knows too little (FAKES_A03, FAKES_A04, FAKES_A05). Before, with the runners in
the student's process: b06's broadcast and DataParallel 4/8, a02's two tests 6/13, a05's ring
forward 4/14 (all measured with nothing forbidden); now 0. SHARED is the
attack on a byte lower bound: ring exercises that compute every result from the other ranks'
inputs read through files in /dev/shm and /tmp and through abstract Unix sockets (no loopback
traffic), and send junk of exactly the ring's size to the ring's neighbours, so that the bytes
the ranks report and the kernel counts are a ring's. With ranks forked from the student's
process (the course's harness before rank sandboxes) it scored both ring tests (4/8 with blank
other exercises), and so it did on rank sandboxes through the abstract sockets their shared
network namespace holds; with no Unix sockets in a rank's sandbox (autograder.isolation.seccomp)
the loopback network is the only channel between ranks and it scores 0. COLLECTIVE_RINGS builds
the rings on all-reduces (dist.all_reduce, the c10d operator by its Python name
`torch.ops.c10d.allreduce_`, the functional collectives) and doctors each rank's own count of its
calls (4/8 when the "point-to-point only" rule read that count); the grader's observer sees each
all-reduce: 0 (more routes below the observed layer: c10d_rings.py).

WHOLE_STATE_ZERO1 and WHOLE_GRADS_ZERO2 are a02's exercises right in numbers and traffic with nothing
sharded in memory (every rank's full AdamW state, every rank's full gradients, kept out of the
optimizer object's reach): 13/13 while the tests checked results and traffic; the memory the grader
measures each rank hold, from outside its sandbox, takes exactly their 6 points.

Graded with none of the lab's forbidden list, so that the score comes from the trusted
measurement alone (no static scan or observer verdict), and b06 also with it, as `camp grade`
does (the fakes only: the reference's full marks are tests/course/test_labs.py's).
Needs root and bubblewrap (the sandbox); skipped elsewhere with that reason.
"""
import dataclasses

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.reference import student_notebook, write_submission
from autograder.grading.grade import GradeOptions, grade
from autograder.isolation.sandbox import namespaces_available
from camplib.dist import separate
from tests.support import saved_results

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not namespaces_available(), reason="the bwrap sandbox needs root and bubblewrap")]

ROOT = repo_root()
FAKED = {"b06": ["test_broadcast_parameters", "test_data_parallel", "test_ring_all_reduce", "test_ring_reduce_scatter"],
         "a02": ["test_zero1", "test_zero2_grads"],
         "a03": ["test_conjugate_ops", "test_parallel_linear", "test_vocab_loss"],
         "a04": ["test_pipeline_train_step"],
         "a05": ["test_ring_forward"]}

FAKES = '''
import importlib
import torch

_harness = importlib.import_module("camplib.dist." + "har" + "ness")
_train = importlib.import_module("camplib.parallel." + "data." + "r" + "un")


def _fake_collective(fn, inputs, backend=None, timeout=60.0):
    n, size = len(inputs), inputs[0].numel() * inputs[0].element_size()
    total = torch.stack(inputs).sum(0)
    kind = getattr(fn, "__name__", "")
    if kind == "ring_reduce_scatter":
        outputs, sent = [total.reshape(-1).chunk(n)[r].clone() for r in range(n)], (n - 1) * size // n
    elif kind == "ring_all_gather":
        outputs, sent = [torch.cat(inputs) for _ in range(n)], (n - 1) * size
    else:
        outputs, sent = [total.clone() for _ in range(n)], 2 * (n - 1) * size // n
    return {"outputs": outputs, "bytes_sent": [sent] * n, "calls": [{"send": n - 1, "recv": n - 1}] * n}


def _junk(nbytes):
    """Put `nbytes` of zeros on the loopback network (one socket to itself): a byte lower bound met."""
    import socket
    import threading
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    sender = threading.Thread(target=client.sendall, args=(bytes(nbytes),))
    sender.start()
    left = nbytes
    while left > 0:
        left -= len(peer.recv(min(left, 1 << 20)))
    sender.join()
    for s in (client, peer, server):
        s.close()


def _fake_module(fn, world_size, model_cfg, seed=0, fn_kwargs=None, backend=None, timeout=60.0):
    src = (fn_kwargs or {}).get("src", 0)
    before = []
    for r in range(world_size):
        model = _train.build_model(model_cfg, seed + r)
        with torch.no_grad():
            for b in model.buffers():
                if b.is_floating_point():
                    b.add_(r + 1)
        before.append({k: v.detach().clone() for k, v in [*model.named_parameters(), *model.named_buffers()]})
    _junk(world_size * sum(v.numel() * v.element_size() for v in before[src].values()))
    return {"before": before, "after": [dict(before[src]) for _ in range(world_size)],
            "bytes_sent": [0] * world_size, "calls": [{"broadcast": len(before[0])}] * world_size}


def _fake_train(wrapper, world_size, model_cfg, x, y, steps=3, lr=0.1, bucket_mb=25.0, seed=0,
                optimizer="sgd", micro_batches=1, backend=None, timeout=60.0):
    ref = _train.train_reference(model_cfg, x, y, steps=steps, lr=lr, seed=seed, optimizer=optimizer)
    sizes = [p.numel() * p.element_size() for p in _train.build_model(model_cfg, 0).parameters()][::-1]
    buckets, filled = 0, None
    for s in sizes:
        if filled is None or filled >= bucket_mb * 2**20:
            buckets, filled = buckets + 1, 0
        filled += s
    _junk(world_size * sum(sizes))
    return {"initial": [ref["initial"]] * world_size, "params": [ref["params"]] * world_size,
            "losses": [ref["losses"]] * world_size, "timeline": [[]] * world_size,
            "bytes_sent": [0] * world_size, "calls": [{"allreduce": steps * buckets}] * world_size}


_zero = importlib.import_module("camplib.parallel." + "zero." + "r" + "un")


def _fake_optimizer(optimizer_cls, world_size, spec, data, steps, hyper=None, average_gradients=False,
                    record_history=False, timeout=120.0):
    model = _zero.build_model(spec)
    opt = torch.optim.AdamW(model.parameters(), **(hyper or {}))
    history = []
    for s in range(steps):
        opt.zero_grad()
        _zero.batch_loss(model, spec, data["x"][s], data["y"][s]).backward()
        opt.step()
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})
    psi = sum(p.numel() for p in model.parameters())
    n = world_size
    _junk(n * steps * 4 * psi)
    return {"history": [history] * n, "params": [history[-1]] * n, "losses": [[0.0] * steps] * n,
            "bytes_per_step": [[4 * psi] * steps] * n, "calls_per_step": [[{}] * steps] * n,
            "grad_bytes_held": [0] * n, "state_bytes_held": [12 * (-(-psi // n))] * n,
            "bytes_sent": [4 * psi * steps] * n, "calls": [{}] * n}


def _fake_shards(fn, world_size, spec, data, timeout=60.0):
    model = _zero.build_model(spec)
    _zero.batch_loss(model, spec, data["x"][0], data["y"][0]).backward()
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    size = -(-flat.numel() // world_size)
    flat = torch.cat([flat, flat.new_zeros(size * world_size - flat.numel())])
    _junk(2 * world_size * 4 * size)
    return {"shards": [flat[r * size:(r + 1) * size].clone() for r in range(world_size)],
            "grads_left": [[] for _ in range(world_size)], "bytes_sent": [4 * size] * world_size,
            "calls": [{"_reduce_scatter_base": 1}] * world_size}


setattr(_zero, "train_optimizer_on_" + "ranks", _fake_optimizer)
setattr(_zero, "gradient_shards_on_" + "ranks", _fake_shards)
setattr(_harness, "run_" + "collective", _fake_collective)
setattr(_train, "run_on_" + "module", _fake_module)
setattr(_train, "train_on_" + "ranks", _fake_train)
'''


RINGS = ["test_ring_all_reduce", "test_ring_reduce_scatter"]
SHARED = '''
import io
import os
import socket
import threading
import time

import torch
import torch.distributed as dist

_runs = {}


def _ring_junk(nbytes):
    """Send `nbytes` of zeros to the right neighbour and take as many from the left: a ring's traffic."""
    r, n = dist.get_rank(), dist.get_world_size()
    out, into = torch.zeros(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    for req in (dist.isend(out, (r + 1) % n), dist.irecv(into, (r - 1) % n)):
        req.wait()


def _serve(server, data, times):
    for _ in range(times):
        peer, _ = server.accept()
        peer.sendall(data)
        peer.close()


def _fetch(address):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(address)
        return torch.load(io.BytesIO(b"".join(iter(lambda: s.recv(1 << 16), b""))))


def _everyones(tensor):
    """Every rank's tensor, without the counted network: through files, and through abstract Unix
    sockets (named in the network namespace, not the file system). Rank order."""
    r, n = dist.get_rank(), dist.get_world_size()
    key = (n, tensor.numel(), str(tensor.dtype))
    _runs[key] = _runs.get(key, 0) + 1
    name = "_".join(map(str, (*key, _runs[key]))).replace("torch.", "")
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    for folder in ("/dev/shm", "/tmp"):
        with open(f"{folder}/{name}_{r}.part", "wb") as f:
            f.write(buffer.getvalue())
        os.replace(f"{folder}/{name}_{r}.part", f"{folder}/{name}_{r}.pt")
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(f"\\0{name}_{r}")
        server.listen(n)
        threading.Thread(target=_serve, args=(server, buffer.getvalue(), n - 1), daemon=True).start()
    except OSError:
        pass
    got, deadline = {r: tensor}, time.monotonic() + 5
    while time.monotonic() < deadline and len(got) < n:
        for k in set(range(n)) - set(got):
            if os.path.exists(f"/tmp/{name}_{k}.pt"):
                got[k] = torch.load(f"/tmp/{name}_{k}.pt")
                continue
            try:
                got[k] = _fetch(f"\\0{name}_{k}")
            except OSError:
                pass
        time.sleep(0.01)
    return [got[k] for k in range(n)]


def ring_reduce_scatter(flat, group=None):
    n, size = dist.get_world_size(), flat.numel() * flat.element_size()
    _ring_junk((n - 1) * size // n)
    return torch.stack(_everyones(flat)).sum(0).chunk(n)[dist.get_rank()].clone()


def ring_all_gather(chunk, group=None):
    n = dist.get_world_size()
    _ring_junk((n - 1) * chunk.numel() * chunk.element_size())
    return torch.cat(_everyones(chunk))


def ring_all_reduce(tensor, group=None):
    n, size = dist.get_world_size(), tensor.numel() * tensor.element_size()
    _ring_junk(2 * (n - 1) * size // n)
    tensor.copy_(torch.stack(_everyones(tensor)).sum(0))
    return tensor
'''


# b06's rings built on torch's collectives (all_reduce: a ring's bytes on the wire, right results),
# with the rank's own count of its calls doctored where the course measures it (the function that
# runs a rank function inside count_bytes, in the rank's process): it reports sends and a ring's
# bytes. The rings' tests judged the rule "point-to-point only" from that count and scored it
# (4/8); they now judge it from what the grader's observer saw each rank call.
COLLECTIVE_RINGS = '''
import importlib

import torch
import torch.distributed as dist

_sep = importlib.import_module("camplib.dist." + "sep" + "arate")
_checked = getattr(_sep, "_che" + "cked")   # what turns a rank's run into its report


def _as_a_ring(returned, rank_fn, rank, counter):
    out = _checked(returned, rank_fn, rank, counter)
    out["calls"] = {"send": 1, "recv": 1}
    out["bytes_sent"] = _bytes.pop() if _bytes else 0
    return out


_bytes = []
setattr(_sep, "_che" + "cked", _as_a_ring)


def ring_reduce_scatter(flat, group=None):
    """All-reduce by the c10d operator's Python name, below dist's functions."""
    n = dist.get_world_size()
    _bytes.append((n - 1) * flat.numel() * flat.element_size() // n)
    total = flat.clone()
    torch.ops.c10d.allreduce_.default([total], dist.group.WORLD.boxed(), torch.classes.c10d.ReduceOp(),
                                      None, False, -1)[1].wait()
    return total.chunk(n)[dist.get_rank()].clone()


def ring_all_gather(chunk, group=None):
    """All-reduce through the functional collectives' operator (what funcol.all_reduce calls)."""
    n = dist.get_world_size()
    _bytes.append((n - 1) * chunk.numel() * chunk.element_size())
    parts = torch.zeros(n, *chunk.shape, dtype=chunk.dtype)
    parts[dist.get_rank()] = chunk
    functional = getattr(torch.ops, "_c10d_" + "functional")
    parts = functional.wait_tensor(functional.all_reduce(parts, "sum", dist.group.WORLD.group_name))
    return parts.reshape(-1, *chunk.shape[1:])


def ring_all_reduce(tensor, group=None):
    n = dist.get_world_size()
    _bytes.append(2 * (n - 1) * tensor.numel() * tensor.element_size() // n)
    dist.all_reduce(tensor)
    return tensor
'''


# a03 with blank exercises: its runners replaced by one-process fakes that compute f, g and the
# vocab-parallel loss from every rank's input at once (with the old in-process runners this scored
# test_conjugate_ops and test_vocab_loss, 5/8), and its rank functions replaced by ones that
# answer from this rank's own shard alone (a dense block, a local loss): on the grader's own ranks
# each holds only its shard (the others' weights are NaN there), so none of them can be right.
FAKES_A03 = '''
import importlib
import torch

_tp = importlib.import_module("camplib.parallel." + "tensor." + "r" + "un")


def _fake_conjugate(copy_cls, reduce_cls, t, inputs, grads, timeout=60.0):
    total_x, total_dy = sum(inputs), sum(grads)
    return {"f": {"y": list(inputs), "x_grad": [total_dy] * t, "calls_forward": [{}] * t,
                  "calls_backward": [{"allreduce": 1}] * t},
            "g": {"y": [total_x] * t, "x_grad": list(grads), "calls_forward": [{"allreduce": 1}] * t,
                  "calls_backward": [{}] * t}}


def _fake_vocab(loss_fn, t, logits, targets, timeout=60.0):
    full = logits.clone().requires_grad_(True)
    loss = -full.log_softmax(-1)[torch.arange(len(targets)), targets].mean()
    loss.backward()
    local = logits.numel() * logits.element_size() // t
    return {"loss": [loss.detach()] * t, "calls_forward": [{"allreduce": 3}] * t, "calls_backward": [{}] * t,
            "largest_bytes": [local] * t, "local_logits_bytes": [local] * t, "logits_grad": full.grad}


def _alone_conjugate(rank, t, classes, mine):
    x, dy = mine["x"], mine["dy"]
    return {"f": {"y": x, "x_grad": t * dy, "calls_forward": {}, "calls_backward": {"allreduce": 1}},
            "g": {"y": t * x, "x_grad": dy, "calls_forward": {"allreduce": 1}, "calls_backward": {}}}


def _alone_vocab(rank, t, loss_fn, mine):
    local = mine["logits"].clone().requires_grad_(True)
    loss = -local.log_softmax(-1).gather(1, (mine["targets"] - mine["vocab_start"]).clamp(0, local.size(1) - 1)[:, None]).mean()
    loss.backward()
    size = local.numel() * local.element_size()
    return {"loss": loss.detach(), "logits_grad": local.grad, "calls_forward": {"allreduce": 3}, "calls_backward": {},
            "largest_bytes": size, "local_logits_bytes": size}


def _alone_block(rank, t, classes, mine):
    block = _tp.dense_block({k: v for k, v in mine["config"].items()}, 0, mine["dtype"])
    block.load_state_dict(mine["state"])
    x = mine["x"].clone().requires_grad_(True)
    y = block(x)
    (y * mine["dy"]).sum().backward()
    layout = _tp.block_layout(block, t)
    grads = {n: p.grad for n, p in block.named_parameters()}
    return {"y": y.detach(), "x_grad": x.grad, "missing": [], "calls_forward": {"allreduce": 2},
            "calls_backward": {"allreduce": 2},
            "grads": {n: (g if layout[n].dim is None else g.chunk(t, layout[n].dim)[rank]) for n, g in grads.items()}}


setattr(_tp, "conjugate_ops_on_" + "ranks", _fake_conjugate)
setattr(_tp, "vocab_loss_on_" + "ranks", _fake_vocab)
setattr(_tp, "conjugate_" + "rank", _alone_conjugate)
setattr(_tp, "vocab_loss_" + "rank", _alone_vocab)
setattr(_tp, "block_" + "rank", _alone_block)
'''
# a04 with blank exercises: its runner replaced by the whole model's step in one process (with the
# old in-process runner this scored test_pipeline_train_step, 4/7), and its rank function by one
# that runs every stage itself: on the grader's own ranks the other stages' weights are NaN and
# only the first stage's rank holds the token ids, only the last's the targets.
FAKES_A04 = '''
import importlib
import torch

_pp = importlib.import_module("camplib.parallel." + "pipeline." + "r" + "un")
_specs = importlib.import_module("camplib.parallel." + "model_" + "specs")


def _whole(spec, idx, targets, state=None):
    model = _specs.build_model(spec)
    if state is not None:
        model.load_state_dict(state)
    _, loss = model(idx, targets)
    loss.backward()
    return loss.detach(), {n: q.grad for n, q in model.named_parameters()}


def _fake_run(spec, idx, targets, p, m, v=1, schedule="1f1b", step_fn=None, *, timeout=60.0):
    loss, grads = _whole(spec, idx, targets)
    return {"loss": loss, "grads": grads, "peak_in_flight": [1] * p, "bytes_sent": [0] * p}


def _alone_rank(rank, p, step_fn, mine):
    loss, grads = _whole(mine["spec"], mine["idx"], mine["targets"], mine["state"])
    return {"loss": loss, "grads": grads, "peak": 1, "events": []}


setattr(_pp, "run_pipeline_" + "spec", _fake_run)
setattr(_pp, "pipeline_spec_" + "rank", _alone_rank)
'''
# a05 with blank exercises: its ring-forward runner replaced by causal attention over the whole
# sequence in one process (softmax of masked scores: nothing the lab forbids), reporting a ring's
# bytes (with the in-process runner, whose test had no byte count, this scored test_ring_forward,
# 4/9), and its rank function by one that attends to this rank's own keys only: on the grader's own
# ranks each holds only its shard of q, k and v.
FAKES_A05 = '''
import importlib
import torch

_cp = importlib.import_module("camplib.parallel." + "context." + "r" + "un")


def _causal(q, k, v, q_pos, k_pos):
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.as_tensor(k_pos)[None, :] > torch.as_tensor(q_pos)[:, None], float("-inf"))
    return scores.softmax(-1) @ v


def _fake_forward(fn, q, k, v, cp, split="zigzag", timeout=30.0):
    t = torch.arange(q.shape[2])
    block = 2 * q[:, :, : q.shape[2] // cp].numel() * q.element_size()
    return {"out": _causal(q, k, v, t, t), "bytes_sent": [(cp - 1) * block] * cp}


def _alone_forward(rank, cp, fn, mine):
    mine_pos = mine["positions"][rank]
    return {"out": _causal(mine["q"], mine["k"], mine["v"], mine_pos, mine_pos)}


setattr(_cp, "run_ring_" + "forward", _fake_forward)
setattr(_cp, "forward_" + "rank", _alone_forward)
'''
# a02: both ZeRO exercises right in numbers and traffic and nothing sharded in memory, the full state kept
# where the course's own accounting (reachable_tensor_bytes, run in the student's process) does not look.
# Scored both tests (13/13) while only results and traffic were checked; the grader's own measurement of
# what each rank holds (Sandbox.resident_bytes, at the pauses of camplib.dist.separate) takes 6 points
WHOLE_STATE_ZERO1 = '''
_WHOLE = {}   # every rank's full AdamW, out of the optimizer object's reach


class Zero1AdamW:
    """Full AdamW state on every rank, updated locally after an all-reduce; the all-gather for show."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = [p for p in params if p.requires_grad]
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        numel = sum(p.numel() for p in self.params)
        self.shard_size = -(-numel // self.world_size)
        _WHOLE[id(self)] = torch.optim.AdamW(self.params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            p.grad.div_(self.world_size)
        _WHOLE[id(self)].step()
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        flat = torch.cat([flat, flat.new_zeros(self.shard_size * self.world_size - flat.numel())])
        full = flat.new_empty(self.shard_size * self.world_size)
        lo = self.rank * self.shard_size
        dist.all_gather_into_tensor(full, flat[lo:lo + self.shard_size].clone())
'''

WHOLE_GRADS_ZERO2 = '''
_KEPT = []   # the full gradients, kept after p.grad is set to None


def reduce_scatter_gradients(params):
    world = dist.get_world_size()
    _KEPT.append([p.grad for p in params])
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    shard_size = -(-flat.numel() // world)
    flat = torch.cat([flat, flat.new_zeros(shard_size * world - flat.numel())])
    for p in params:
        p.grad = None
    shard = flat.new_empty(shard_size)
    dist.reduce_scatter_tensor(shard, flat)
    return shard / world
'''


SEPARATE = {"b06": FAKED["b06"], "a02": FAKED["a02"], "a03": FAKED["a03"], "a04": FAKED["a04"],
            "a05": ["test_ring_forward"]}   # tests run on the grader's own ranks


def _after_setup(nb, source):
    """`source` as a plain cell right after the setup cell."""
    i = next(i for i, c in enumerate(nb.cells) if "setup" in c.metadata.get("tags", []))
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))
    return nb


def _graded(tmp, catalog, lab, forbid):
    """The fakes graded; the reference too where nothing is forbidden (with the lab's forbidden list
    it is tests/course/test_labs.py's full marks). a05: the fake in a cell only. a02: not the reference
    but the same notebook with its two ZeRO exercises kept whole (its other tests: the reference's full
    marks; the reference's own, memory checks included, are test_labs')."""
    subs, out = tmp / "submissions", tmp / "workspace"
    if not forbid and lab != "a02":
        write_submission(subs, "ada", lab, student_notebook(lab))
    fakes = {"a03": FAKES_A03, "a04": FAKES_A04, "a05": FAKES_A05}.get(lab, FAKES)
    write_submission(subs, "fake_in_cell", lab, _after_setup(student_notebook(lab, solve=False), fakes))
    if lab != "a05":
        beside = write_submission(subs, "fake_beside", lab,
                                  _after_setup(student_notebook(lab, solve=False), "import helpers  # noqa"))
        (beside.parent / "helpers.py").write_text(fakes)
    if lab == "a02" and not forbid:
        write_submission(subs, "whole_state", lab, student_notebook(lab, {"zero1": WHOLE_STATE_ZERO1,
                                                                          "zero2_grads": WHOLE_GRADS_ZERO2}))
    if lab == "b06":
        write_submission(subs, "shared", lab, _with_last(student_notebook(lab, solve=False), SHARED))
        write_submission(subs, "collective_rings", lab, _with_last(student_notebook(lab, solve=False), COLLECTIVE_RINGS))
    rows = {r.student: r for r in grade(subs, catalog, ROOT, out, lab, GradeOptions(jobs=1))}
    return rows, saved_results(out, catalog.get(lab).name)


def _with_last(nb, source):
    """`source` as the notebook's last cell: it defines the exercises' names after the blank ones."""
    nb.cells.append(nbformat.v4.new_code_cell(source))
    return nb


def _without_forbid(catalog, lab_id):
    labs = tuple(dataclasses.replace(lab, forbid=()) if lab.id == lab_id else lab for lab in catalog.labs)
    return dataclasses.replace(catalog, labs=labs)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """(lab, with the lab's forbidden list?) -> (rows, saved results), each graded once."""
    runs = {}

    def run(lab, forbid):
        if (lab, forbid) not in runs:
            catalog = Catalog.load() if forbid else _without_forbid(Catalog.load(), lab)
            runs[lab, forbid] = _graded(tmp_path_factory.mktemp(f"{lab}_{forbid}"), catalog, lab, forbid)
        return runs[lab, forbid]
    return run


# a03's, a04's and a05's fakes write into a library module, which the static scan already refuses as
# tampering: graded only with nothing forbidden, where the grader's own ranks are what catch them. a02's
# too: its tests run on the grader's ranks, where the fakes are never called, and the lab's forbidden list
# can only add zeroes (a02 as graded took 43 s at load ~13, what a05's fake costs; b06's is graded anyway
# for its rings)
@pytest.mark.parametrize(("lab", "forbid"), [(lab, forbid) for lab in sorted(FAKED) for forbid in (True, False)
                                             if not (forbid and lab in ("a02", "a03", "a04", "a05"))],
                         ids=lambda v: {True: "as_graded", False: "measured_only"}.get(v, v) if isinstance(v, bool) else v)
def test_a_faked_harness_scores_nothing_and_the_reference_everything(graded, lab, forbid):
    rows, details = graded(lab, forbid)
    if "ada" in rows:
        assert (rows["ada"].score, rows["ada"].status) == (rows["ada"].max_score, "graded") and rows["ada"].score > 0, \
            ([t["message"] for t in details["ada"]["tests"] if t["message"]], details["ada"].get("seed"))
    for student in ("fake_in_cell", "fake_beside"):
        if student not in rows:
            continue
        scored = {t["grade_id"]: t["score"] for t in details[student]["tests"] if t["grade_id"] in FAKED[lab]}
        assert sorted(scored) == FAKED[lab] and set(scored.values()) == {0.0}, (student, details[student]["tests"])


@pytest.mark.parametrize("lab", ["a02", "b06"])
def test_with_nothing_forbidden_the_graders_own_ranks_run_the_blank_exercises(graded, lab):
    """The faked runners are never called: each test's ranks are the grader's, where the blank
    exercise raises (measured only: no static scan or observer verdict in the way)."""
    _, details = graded(lab, False)
    for student in ("fake_in_cell", "fake_beside"):
        for test in details[student]["tests"]:
            if test["grade_id"] in FAKED[lab]:
                assert "rank 0 of" in test["message"] and "not written yet" in test["message"], (student, test)


@pytest.mark.parametrize("forbid", [True, False], ids=["as_graded", "measured_only"])
def test_rings_that_share_files_and_send_junk_score_nothing(graded, forbid):
    _, details = graded("b06", forbid)
    scored = {t["grade_id"]: (t["score"], t["message"]) for t in details["shared"]["tests"]}
    assert all(scored[g][0] == 0.0 for g in RINGS), scored
    assert all("rank" in scored[g][1] for g in RINGS), scored


@pytest.mark.parametrize("forbid", [True, False], ids=["as_graded", "measured_only"])
def test_rings_built_on_all_reduce_score_nothing_whatever_the_ranks_count(graded, forbid):
    # the attack doctors this private function; if it moves, the cell stops at an AttributeError and
    # the blank rings score 0 for the wrong reason: rename the attack with it
    assert callable(getattr(separate, "_checked", None)), "camplib.dist.separate._checked moved: update COLLECTIVE_RINGS"
    _, details = graded("b06", forbid)
    scored = {t["grade_id"]: (t["score"], t["message"]) for t in details["collective_rings"]["tests"]}
    assert all(scored[g][0] == 0.0 for g in RINGS), scored
    if not forbid:   # the grader's observer saw the all-reduce (with the forbidden list, the static scan may speak first)
        assert all("uses point-to-point messages only" in scored[g][1] for g in RINGS), scored
        assert "['allreduce']" in scored["test_ring_reduce_scatter"][1], scored          # torch.ops.c10d's
        assert "_c10d_functional::all_reduce" in scored["test_ring_all_reduce"][1], scored   # the functional one


def test_zero_state_kept_whole_on_every_rank_loses_exactly_the_two_zero_tests(graded):
    """a02's optimizer state (ZeRO-1) and gradients (ZeRO-2) kept whole on every rank, out of the
    optimizer object's reach: right numbers, right traffic, the memory of a rank measured by the
    grader gives it away (the reference's full marks, the same memory checks passed: test_labs)."""
    rows, details = graded("a02", False)
    scored = {t["grade_id"]: (t["score"], t["message"]) for t in details["whole_state"]["tests"]}
    assert sorted(g for g, (score, _) in scored.items() if score == 0) == ["test_zero1", "test_zero2_grads"], scored
    assert rows["whole_state"].score == rows["whole_state"].max_score - 6, scored   # the rest: full marks
    assert "memory rank 0 keeps between steps" in scored["test_zero1"][1], scored
    assert "Shard the optimizer state" in scored["test_zero1"][1], scored
    assert "memory rank 0 holds after reduce_scatter_gradients" in scored["test_zero2_grads"][1], scored
