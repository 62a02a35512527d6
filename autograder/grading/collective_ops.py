"""The c10d operators by their Python names, in a rank's sandbox: `torch.ops.c10d.allreduce_`
(and its overloads, `.default`), `torch.ops._c10d_functional.all_reduce` (what
torch.distributed._functional_collectives, DTensor and torch.compile's graphs call),
`_c10d_functional_autograd`'s and `_dtensor`'s collectives. Each is replaced, on its op
namespace, by a proxy that reports the call (entry "ops.<namespace>::<op>") and then calls the
operator torch had there. Nothing else changes: the proxy is a Python call in front of torch's
own, which releases the GIL while the operator runs and waits, as a direct call does (a Python
*kernel* at the dispatcher instead held it while gloo's enqueue waited for a worker that needed
it: autograder.grading.observe).

A proxy hands out what describes the operator (its schema, name, overloads, each a proxy too)
and nothing that calls it past the report (`.op`, `._op`, `.redispatch`, `._overloadpacket`,
`.py_kernels`...: AttributeError). Operators the proxy holds are reachable only by reaching
past Python functions (`__closure__`, gc), and fresh ones only through torch's private
constructors (`torch._ops._OpNamespace`, `torch._C._jit_get_operation`): the static scan
(autograder.grading.forbid) refuses both, by name or by a computed one. Not seen here: C++ that
calls a collective itself (DDP's Reducer, `dist._broadcast_coalesced`), also refused by the scan.
"""
from __future__ import annotations

import torch

OPS_PREFIX = "ops."
# the collectives of each namespace (point-to-point, barriers and waits are not)
OP_COLLECTIVES = {
    "c10d": ("allreduce_", "allreduce_coalesced_", "broadcast_", "reduce_", "allgather_", "_allgather_base_",
             "allgather_coalesced_", "allgather_into_tensor_coalesced_", "reduce_scatter_", "_reduce_scatter_base_",
             "reduce_scatter_tensor_coalesced_", "alltoall_", "alltoall_base_", "gather_", "scatter_"),
    "_c10d_functional": ("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_",
                         "all_gather_into_tensor", "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced",
                         "reduce_scatter_tensor", "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced",
                         "all_to_all_single", "broadcast", "broadcast_"),
    "_c10d_functional_autograd": ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"),
    "_dtensor": ("shard_dim_alltoall",),
}
OP_ENTRIES = tuple(f"{OPS_PREFIX}{ns}::{op}" for ns, ops in OP_COLLECTIVES.items() for op in ops)
# what a proxy hands out: descriptions, never a way to call the operator
_DESCRIBES = frozenset({"__name__", "__qualname__", "__module__", "_schema", "name", "namespace", "overloads",
                        "_qualified_op_name", "_overload_names", "_opname", "_overloadname", "_name", "_namespace",
                        "tags", "_tags", "is_view", "_dir"})


def _proxy(original, message: tuple[str, ...], report, overloads: dict):
    """An object that reports `message` and calls `original` when called; `overloads`: name ->
    its own proxy (a packet's `.default`...)."""

    class Proxy:
        __slots__ = ()

        def __call__(self, *args, **kwargs):
            report(message)
            return original(*args, **kwargs)

        def __getattr__(self, name):
            if name in overloads:
                return overloads[name]
            if name in _DESCRIBES:
                return getattr(original, name)
            raise AttributeError(f"{message[0]}.{name} is not available in the grader's ranks "
                                 "(call torch.distributed's functions)")

        def __repr__(self):
            return repr(original)

    return Proxy()


def wire_ops(report) -> list[str]:
    """Report-then-call proxies for OP_COLLECTIVES on torch.ops' namespaces, for the life of this
    process; the entries wired (an operator this torch lacks is left out)."""
    # registers the c10d operators, and the functional ones with their autograd (which reads
    # private attributes of the operators a proxy does not hand out): before the proxies
    import torch.distributed._functional_collectives  # noqa: F401
    wired = []
    for ns, ops in OP_COLLECTIVES.items():
        namespace = getattr(torch.ops, ns)
        for op in ops:
            try:
                packet = getattr(namespace, op)
            except (AttributeError, RuntimeError):
                continue
            entry = f"{OPS_PREFIX}{ns}::{op}"
            message = (entry,)
            overloads = {name: _proxy(getattr(packet, name), message, report, {}) for name in packet.overloads()}
            setattr(namespace, op, _proxy(packet, message, report, overloads))
            wired.append(entry)
    return wired


def op_canary(entry: str) -> None:
    """Call the operator of `entry` as the student would name it (`torch.ops.<ns>.<op>.default`),
    with no arguments: the proxy reports, then torch refuses the call (nothing runs)."""
    ns, op = entry.removeprefix(OPS_PREFIX).split("::")
    overload = getattr(getattr(getattr(torch.ops, ns), op), "default")
    try:
        overload()
    except (TypeError, RuntimeError):
        pass
