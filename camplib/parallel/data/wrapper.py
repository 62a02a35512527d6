"""Data parallelism from scratch: every rank holds the whole model, sees its own shard of the
batch, and the ranks average their gradients so that they all take the same step.

`DataParallel(module, bucket_mb=25)` does what `torch.nn.parallel.DistributedDataParallel`
does, in a page of code:

- at construction it **broadcasts** rank 0's parameters and buffers: ranks that initialised
  their models with different seeds would otherwise train N different models;
- it groups the gradients into **buckets** of about `bucket_mb` megabytes, in reverse parameter
  order (backward produces the last layers' gradients first), and hooks every parameter
  (`register_post_accumulate_grad_hook`). As soon as every gradient of a bucket is ready the
  bucket is flattened into one buffer and its all-reduce is **launched asynchronously**: the
  network works on bucket k while autograd still computes the gradients of bucket k+1;
- `finish_gradient_sync()` (call it after `backward()`, before `optimizer.step()`) waits for
  the buckets, divides the sums by the world size **once**, and copies them back into `.grad`.
  It is explicit (DDP hides it in an autograd callback) so that the order of events is visible;
- `no_sync()` skips the communication for gradient-accumulation micro-batches: gradients add up
  locally in `.grad`, and the next backward outside `no_sync()` all-reduces the sum.

`timeline` records, per step and bucket, when its gradients were ready, and when its
communication started and ended: the data of the compute/communication overlap plot.
`camplib.parallel.data.run.train_on_ranks` trains with a wrapper like this one on N ranks and
brings back plain data (what tests and the lab's grader compare); this module does not import it.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DataParallel", "Bucket", "Timeline", "broadcast_module", "make_buckets"]


def broadcast_module(module: nn.Module, group=None, src: int = 0) -> None:
    """Overwrite every parameter and buffer with rank `src`'s values (src is a rank of `group`)."""
    src_global = dist.get_global_rank(group, src) if group is not None else src
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=src_global, group=group)


@dataclass
class Bucket:
    """Parameters whose gradients travel together in one flat buffer."""
    params: list[nn.Parameter]
    ready: int = 0                       # gradients of this bucket ready in the current backward
    flat: torch.Tensor | None = None     # the buffer being all-reduced
    work: object = None                  # the async all-reduce's handle (None: done, or not launched)
    launched: bool = False

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


def make_buckets(params: list[nn.Parameter], bucket_bytes: int) -> list[Bucket]:
    """Cut `params` (in the order their gradients are expected) into buckets of at least
    `bucket_bytes` each (the last may be smaller); a new bucket starts at a dtype/device change."""
    buckets: list[Bucket] = []
    current: list[nn.Parameter] = []
    size = 0
    for p in params:
        if current and (size >= bucket_bytes or (p.dtype, p.device) != (current[0].dtype, current[0].device)):
            buckets.append(Bucket(current))
            current, size = [], 0
        current.append(p)
        size += p.numel() * p.element_size()
    if current:
        buckets.append(Bucket(current))
    return buckets


@dataclass
class TimelineEvent:
    step: int
    bucket: int
    nbytes: int
    ready: float        # seconds (perf_counter) when the bucket's last gradient was ready
    comm_start: float   # when its all-reduce was launched
    comm_end: float | None = None   # when it completed (set from the communication thread)


@dataclass
class Timeline:
    """Per step: when its forward started and its backward ended; per bucket a TimelineEvent."""
    step_start: dict[int, float] = field(default_factory=dict)
    backward_end: dict[int, float] = field(default_factory=dict)
    events: list[TimelineEvent] = field(default_factory=list)

    def as_dicts(self) -> list[dict]:
        """Plain data, seconds since the step's forward started: for plots, and to pickle."""
        out = []
        for e in self.events:
            t0 = self.step_start.get(e.step, e.ready)
            end = e.comm_end if e.comm_end is not None else e.comm_start
            out.append({"step": e.step, "bucket": e.bucket, "nbytes": e.nbytes, "ready": e.ready - t0,
                        "comm_start": e.comm_start - t0, "comm_end": end - t0,
                        "backward_end": self.backward_end.get(e.step, e.ready) - t0})
        return out


class DataParallel(nn.Module):
    """Wrap `module` for data-parallel training over `group` (default: all ranks).

    `collectives`: None uses `dist.all_reduce(async_op=True)`; an object with an in-place
    `all_reduce(tensor)` (camplib.dist.ring.RingCollectives, say) is called synchronously instead.
    """

    def __init__(self, module: nn.Module, bucket_mb: float = 25.0, group=None, collectives=None):
        super().__init__()
        self.module, self.group, self.collectives = module, group, collectives
        self.world_size = dist.get_world_size(group)
        broadcast_module(module, group)
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = make_buckets(params[::-1], int(bucket_mb * 2**20))
        self._bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b.params}
        self._sync = True
        self.step_index = 0
        self.timeline = Timeline()
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *args, **kwargs):
        self.timeline.step_start.setdefault(self.step_index, time.perf_counter())
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate gradients locally (no communication)."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    # -- during backward ------------------------------------------------------------------
    def _grad_ready(self, param: nn.Parameter) -> None:
        if not self._sync:
            return
        bucket = self.buckets[self._bucket_of[param]]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._launch(self._bucket_of[param])

    def _launch(self, index: int) -> None:
        bucket = self.buckets[index]
        ready = time.perf_counter()
        bucket.flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                 for p in bucket.params])
        event = TimelineEvent(self.step_index, index, bucket.nbytes, ready, time.perf_counter())
        self.timeline.events.append(event)
        bucket.launched = True
        if self.collectives is not None:
            self.collectives.all_reduce(bucket.flat)
            event.comm_end = time.perf_counter()
            return
        bucket.work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)
        bucket.work.get_future().then(lambda _: setattr(event, "comm_end", time.perf_counter()))

    # -- after backward ---------------------------------------------------------------------
    def finish_gradient_sync(self) -> None:
        """Wait for every bucket, average once, write the result into each parameter's .grad.
        Buckets whose gradients never all arrived (unused parameters) are sent now, with zeros
        for the missing gradients, so that every rank takes part in the same all-reduces."""
        if not self._sync:
            raise RuntimeError("finish_gradient_sync() inside no_sync(): there is nothing to wait for")
        self.timeline.backward_end.setdefault(self.step_index, time.perf_counter())
        for index, bucket in enumerate(self.buckets):
            if not bucket.launched:
                self._launch(index)
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()
            bucket.flat.div_(self.world_size)
            offset = 0
            for p in bucket.params:
                n = p.numel()
                synced = bucket.flat[offset:offset + n].view_as(p)
                if p.grad is None:
                    p.grad = synced.clone()
                else:
                    p.grad.copy_(synced)
                offset += n
            bucket.ready, bucket.flat, bucket.work, bucket.launched = 0, None, None, False
        self.step_index += 1
