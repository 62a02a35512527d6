"""The communication of pipeline parallelism: point-to-point messages between neighbouring stages.

Forward, stage s sends its output activation to stage s + 1; backward, stage s + 1 sends the
gradient of that activation back to stage s. Nothing else crosses ranks, except the gradient of
a tied embedding when the first and the last stage live on different ranks (`sum_tied_grad`).

Why it cannot deadlock when the schedule is runnable: sends are non-blocking (`isend`, waited on
in `finish`), so a rank only ever waits for what it needs next, a receive; and every message
carries a tag naming (micro-batch, stage, direction), so a receive takes exactly the message it
asks for whatever order they were sent in. `camplib.parallel.pipeline.schedule.simulate` models
exactly this, so a schedule it runs, the ranks run. Every wait has a timeout that names the
rank, the micro-batch and the stage it was waiting for.

Stages on the same rank (one rank, or interleaved chunks) hand tensors over through a local
mailbox instead of the network.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["PipelineComm", "sum_tied_grad"]

FORWARD, BACKWARD = 0, 1


class PipelineComm:
    """Sends and receives of one rank. Stage s lives on pipeline rank s % p. `shape` and `dtype`
    are an activation's (micro-batch, time, d_model): receivers allocate them (on `device`: a
    rank's GPU with NCCL). `ranks` maps pipeline ranks to global ranks (a pipeline group of a 4D
    mesh); by default they are equal. NCCL ignores tags and matches a pair's messages in order:
    with one chunk per rank each direction carries one kind of message, sent and received in
    micro-batch order, so the tags' matching and NCCL's agree."""

    def __init__(self, rank: int, p: int, n_stages: int, shape: tuple[int, ...], dtype: torch.dtype,
                 timeout: float = 60.0, ranks: list[int] | None = None, device=None):
        self.rank, self.p, self.n_stages = rank, p, n_stages
        self.ranks = list(ranks) if ranks is not None else list(range(p))
        self.shape, self.dtype, self.timeout, self.device = tuple(shape), dtype, timeout, device
        self.pending: list = []                            # isend handles, waited in finish()
        self.mailbox: dict[int, torch.Tensor] = {}         # tag -> tensor, between stages of this rank
        self.bytes_sent = 0

    def _tag(self, mb: int, stage: int, direction: int) -> int:
        return (mb * self.n_stages + stage) * 2 + direction

    def _send(self, tensor: torch.Tensor, to_stage: int, mb: int, direction: int) -> None:
        tag, dst = self._tag(mb, to_stage, direction), to_stage % self.p
        tensor = tensor.detach().contiguous()
        if dst == self.rank:
            self.mailbox[tag] = tensor.clone()
            return
        self.pending.append(dist.isend(tensor, self.ranks[dst], tag=tag))
        self.bytes_sent += tensor.numel() * tensor.element_size()

    def _recv(self, stage: int, from_stage: int, mb: int, direction: int) -> torch.Tensor:
        tag, src = self._tag(mb, stage, direction), from_stage % self.p
        if src == self.rank:
            if tag not in self.mailbox:
                raise RuntimeError(f"rank {self.rank}: stage {stage} expects micro-batch {mb}'s "
                                   f"{'activation' if direction == FORWARD else 'gradient'} from stage "
                                   f"{from_stage} on this same rank, which has not produced it yet: the "
                                   "schedule runs an action before the one it depends on")
            return self.mailbox.pop(tag)
        buf = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        work = dist.irecv(buf, self.ranks[src], tag=tag)
        try:
            work.wait(timedelta(seconds=self.timeout))
        except RuntimeError as exc:
            what = "activation" if direction == FORWARD else "gradient"
            raise RuntimeError(f"rank {self.rank}: stage {stage} waited more than {self.timeout:g} s for micro-batch "
                               f"{mb}'s {what} from stage {from_stage} (rank {src}): does rank {src}'s "
                               f"schedule run that action, and not after one that waits for this rank? ({exc})"
                               ) from exc
        return buf

    def send_forward(self, activation: torch.Tensor, mb: int, stage: int) -> None:
        """Stage `stage`'s output for micro-batch `mb`, to stage + 1."""
        self._send(activation, stage + 1, mb, FORWARD)

    def recv_forward(self, mb: int, stage: int) -> torch.Tensor:
        """Stage `stage`'s input for micro-batch `mb` (stage - 1's output); a plain tensor."""
        return self._recv(stage, stage - 1, mb, FORWARD)

    def send_backward(self, grad: torch.Tensor, mb: int, stage: int) -> None:
        """The gradient of stage `stage`'s input for micro-batch `mb`, to stage - 1."""
        self._send(grad, stage - 1, mb, BACKWARD)

    def recv_backward(self, mb: int, stage: int) -> torch.Tensor:
        """The gradient of stage `stage`'s output for micro-batch `mb`, from stage + 1."""
        return self._recv(stage, stage + 1, mb, BACKWARD)

    def finish(self) -> None:
        """Wait for every send (call at the end of the step, before reading results)."""
        for work in self.pending:
            work.wait(timedelta(seconds=self.timeout))
        self.pending.clear()
        if self.mailbox:
            raise RuntimeError(f"rank {self.rank}: {len(self.mailbox)} messages between its own stages were never "
                               "received: the schedule misses some actions")


def sum_tied_grad(param: torch.nn.Parameter, rank: int, first: int, last: int, timeout: float = 60.0) -> None:
    """A weight shared by the first stage (token embedding, on rank `first`) and the last (LM head,
    on rank `last`) collects part of its gradient on each: make both hold the sum (Megatron's
    embedding all-reduce, here two messages). Call on both ranks after the step; no-op elsewhere."""
    if first == last or rank not in (first, last):
        return
    grad = param.grad if param.grad is not None else torch.zeros_like(param)
    other = torch.empty_like(grad)
    peer = last if rank == first else first
    send = dist.isend(grad.contiguous(), peer)
    try:
        dist.irecv(other, peer).wait(timedelta(seconds=timeout))
        send.wait(timedelta(seconds=timeout))
    except RuntimeError as exc:
        raise RuntimeError(f"rank {rank} waited more than {timeout:g} s for the tied embedding's gradient from "
                           f"rank {peer} (the {'last' if rank == first else 'first'} stage): did rank {peer} finish "
                           f"its step? ({exc})") from exc
    # both ranks add in the same order (first's part + last's part): bitwise equal results
    param.grad = grad + other if rank == first else other + grad
