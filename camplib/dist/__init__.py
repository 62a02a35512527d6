"""camplib.dist: running code on N ranks of torch.distributed, and the collectives the course
builds from point-to-point messages.

- `launch` (launch.py): N processes from a notebook, a script or torchrun; loud, bounded failures.
  `in_child(fn, *args)`: one forked child, no process group, for single-process computations that
  run autograd (a notebook's references): the process that forks ranks must never have run
  autograd on a machine with a GPU (launch.py's docstring says why).
- `on_ranks` (ranks.py): THE way to look at distributed code from the outside (tests, the
  grader, benchmarks, lab demos). `on_ranks(rank_fn, world_size, *args)` runs
  `rank_fn(rank, world_size, *args)` on every rank through `launch`, inside `count_bytes()`;
  each rank returns a dict of plain data, and the result is one format:
  `{key: [rank 0's value, rank 1's, ...], "bytes_sent": [per rank], "calls": [per rank]}`.
  A runner (run_collective, camplib.parallel.data.run / zero.run / data.compression_run) is a
  rank function plus one call of it, in a module of its own that the library code it exercises
  never imports.
- `ring` (ring.py): reduce-scatter, all-gather and all-reduce on a ring of sends and receives;
  `TorchCollectives` / `RingCollectives` give code a choice between torch's and the ring.
- `counting` (counting.py): the bytes a rank sends and the collectives it calls, measured.
- `harness` (harness.py): `run_collective`, a collective on N ranks (lab b06's tests).
"""
from .launch import RankDied, RankError, RankTimeout, default_backend, in_child, launch, under_torchrun
from .ranks import on_ranks

__all__ = ["launch", "in_child", "on_ranks", "RankError", "RankDied", "RankTimeout", "default_backend", "under_torchrun"]
