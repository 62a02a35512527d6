"""The static scan refuses torch.distributed's collectives below the layer a rank's observer wraps
(autograder.grading.observe, collective_ops): the c10d operators by their Python names, the raw
C++ module, torch's private operator constructors, C++ that calls collectives itself, and reaching
past the wrappers to their originals; by name, alias, import, `sys.modules`, getattr or
attrgetter with literal or built names. Honest rings (send/recv, isend/irecv, batch_isend_irecv)
and mentions in comments, strings or annotations cost nothing. b06's forbid list. (~1 s)"""
import pytest

from autograder.catalog import Catalog
from autograder.grading.forbid import check

FORBID = list(Catalog.load().get("b06").forbid)
PRELUDE = "import importlib, inspect, operator, sys\nimport torch\nimport torch.distributed as dist\n"


@pytest.mark.parametrize("source, says", [
    ("torch.ops.c10d.allreduce_([t], g, op, None, False)", "below the layer the grader observes"),
    ("torch.ops.c10d.allreduce_.default([t], g, op, None, False)", "below the layer the grader observes"),
    ("ops = torch.ops\nf = ops.c10d.broadcast_", "below the layer the grader observes"),
    ("f = getattr(torch.ops, 'c' + '10d').allreduce_", "below the layer the grader observes"),
    ("f = getattr(torch.ops, ''.join(reversed('d01c')))", "below the layer the grader observes"),
    ("f = operator.attrgetter('ops.c10d.allreduce_')(torch)", "below the layer the grader observes"),
    ("f = torch.ops._c10d_functional.all_reduce(t, 'sum', '0')", "below the layer the grader observes"),
    ("m = importlib.import_module('torch._C.' + '_distributed_c10d')", "below the layer the grader observes"),
    ("from torch._C._distributed_c10d import ProcessGroupGloo", "below the layer the grader observes"),
    ("m = __import__('torch._C._distributed_c10d', fromlist=['x'])", "below the layer the grader observes"),
    ("m = sys.modules['torch._C._distributed_c10d']", "loads or replaces code"),
    ("f = torch._C._jit_get_operation('c10d::allreduce_')", "below the layer the grader observes"),
    ("f = torch._ops.OpOverloadPacket", "below the layer the grader observes"),
    ("ns = torch._ops._OpNamespace('c10d')", "below the layer the grader observes"),
    ("dist._broadcast_coalesced(g, [t], 1024, 0)", "below the layer the grader observes"),
    ("cu = torch.jit.CompilationUnit(code)", "loads or replaces code"),     # TorchScript calls operators by name
    ("m = torch.jit.load(io)", "loads or replaces code"),
    ("def f(x):\n    return x.c10d", "below the layer the grader observes"),
    # the wrappers' originals
    ("f = dist.ProcessGroup.allreduce.__closure__[0].cell_contents", "reaches past"),
    ("f = getattr(dist.ProcessGroup.allreduce, '__closure__')", "reaches past"),
    ("f = getattr(dist.ProcessGroup.allreduce, '__clo' + 'sure__')", "reaches past"),
    ("f = getattr(g, '__clo' + kind)", "could spell"),
    ("f = operator.attrgetter('allreduce.__wrapped__')(dist.ProcessGroup)", "reaches past"),
    ("f = inspect.unwrap(dist.ProcessGroup.allreduce)", "machinery"),
])
def test_a_route_below_the_observed_collectives_is_a_finding(source, says):
    result = check(PRELUDE + source, FORBID)
    assert any(says in f for f in result.findings), (source, result.findings, result.hits)


HONEST = {
    "isend_irecv": """
def ring_all_reduce(tensor, group=None):
    # a ring, not dist.all_reduce (torch.ops.c10d.allreduce_ underneath): reduce-scatter, all-gather
    r, n = dist.get_rank(group), dist.get_world_size(group)
    for step in range(n - 1):
        into = torch.empty_like(tensor)
        reqs = [dist.isend(tensor, (r + 1) % n, group=group), dist.irecv(into, (r - 1) % n, group=group)]
        for q in reqs:
            q.wait()
        tensor += into
    return tensor
""",
    "batch": """
def ring_all_gather(chunk, group: dist.ProcessGroup | None = None):
    '''Like all_gather, with batch_isend_irecv: "c10d" is torch's name for this layer.'''
    r, n = dist.get_rank(group), dist.get_world_size(group)
    into = torch.empty_like(chunk)
    ops = [dist.P2POp(dist.isend, chunk, (r + 1) % n, group), dist.P2POp(dist.irecv, into, (r - 1) % n, group)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    return torch.cat([chunk, into])
""",
    "send_recv": """
def ring_reduce_scatter(flat, group=None):
    r, n = dist.get_rank(), dist.get_world_size()
    parts = list(flat.chunk(n))
    if r % 2 == 0:
        dist.send(parts[r], (r + 1) % n)
        dist.recv(parts[r - 1], (r - 1) % n)
    else:
        dist.recv(parts[r - 1], (r - 1) % n)
        dist.send(parts[r], (r + 1) % n)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    layer = getattr(backend, f"layer{r}", None)
    return parts[(r + 1) % n]
""",
    "own_names": """
class Ring:
    def c10d(self):
        return "mine"
    def use(self, op):
        return self.c10d(), getattr(self, "_" + "ring"), getattr(self, f"__{op}__")
""",
}


@pytest.mark.parametrize("name", sorted(HONEST))
def test_an_honest_ring_costs_nothing(name):
    result = check(PRELUDE + HONEST[name], FORBID)
    assert (result.hits, result.findings) == ([], []), (name, result.hits, result.findings)
