"""camplib.dist: running code on N ranks of torch.distributed, and the collectives the course
builds from point-to-point messages.

- `launch` (launch.py): N processes from a notebook, a script or torchrun; loud, bounded failures.
- `ring` (ring.py): reduce-scatter, all-gather and all-reduce on a ring of sends and receives;
  `TorchCollectives` / `RingCollectives` give code a choice between torch's and the ring.
- `counting` (counting.py): the bytes a rank sends and the collectives it calls, measured.
- `harness` (harness.py): run a function on N ranks and bring back outputs, bytes and calls.
"""
from .launch import RankDied, RankError, RankTimeout, default_backend, launch, under_torchrun

__all__ = ["launch", "RankError", "RankDied", "RankTimeout", "default_backend", "under_torchrun"]
