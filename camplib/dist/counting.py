"""Count the bytes a rank sends: the measurement behind "each rank sends 2(N-1)/N * S".

`with count_bytes() as c:` wraps the methods of torch's `ProcessGroup` (the layer every
torch.distributed function ends in, however it was imported) for the duration: `send` adds
the bytes of the tensors sent to `c.sent`; every wrapped method adds to `c.calls[name]`
(ProcessGroup names: "send", "recv", "allreduce", "_reduce_scatter_base", "_allgather_base",
"broadcast", ...), and collectives add the bytes of the tensors handed to them to
`c.payload[name]`. gloo's own collective algorithms are hidden, so what a collective really
sends on the wire can only be measured on a ring built from sends (camplib.dist.ring).
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch._C._distributed_c10d import ProcessGroup

__all__ = ["CommCounter", "count_bytes"]

POINT_TO_POINT = ("send", "recv", "recv_anysource")
COLLECTIVES = ("allreduce", "allreduce_coalesced", "reduce_scatter", "_reduce_scatter_base",
               "reduce_scatter_tensor_coalesced", "allgather", "_allgather_base", "allgather_coalesced",
               "allgather_into_tensor_coalesced", "broadcast", "reduce", "alltoall", "alltoall_base",
               "gather", "scatter", "barrier")


@dataclass
class CommCounter:
    sent: int = 0                                      # bytes sent point-to-point by this rank
    calls: Counter = field(default_factory=Counter)    # ProcessGroup method -> number of calls
    payload: Counter = field(default_factory=Counter)  # collective -> bytes of tensors handed in


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


@contextlib.contextmanager
def count_bytes():
    counter = CommCounter()
    # the class's own descriptors (not getattr's bound-less builtins), so that putting them back
    # restores exactly what was there
    originals = {n: ProcessGroup.__dict__[n] for n in POINT_TO_POINT + COLLECTIVES if n in ProcessGroup.__dict__}

    def wrap(name, descriptor):
        method = descriptor.__get__(None, ProcessGroup) if hasattr(descriptor, "__get__") else descriptor

        def counted(self, *args, **kwargs):
            counter.calls[name] += 1
            first = args[0] if args else None
            if name == "send":
                counter.sent += _nbytes(first)
            elif name in COLLECTIVES:
                counter.payload[name] += _nbytes(first)
            return method(self, *args, **kwargs)
        return counted

    try:
        for name, method in originals.items():
            setattr(ProcessGroup, name, wrap(name, method))
        yield counter
    finally:
        for name, method in originals.items():
            setattr(ProcessGroup, name, method)
