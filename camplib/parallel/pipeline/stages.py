"""Pipeline parallelism (GPipe, Huang et al. 2019; 1F1B, Narayanan et al. 2021): camplib's GPT cut
into stages of consecutive blocks, each stage on a rank, micro-batches flowing through them.

- `split_layers(n_layer, n_stages)`: which blocks each stage holds (as even as possible).
- `PipelineStage`: one stage built from a dense `camplib.model.GPT`: the embeddings on the first
  stage, its blocks, the final norm, LM head and loss on the last. Parameters keep the dense
  model's names, so gradients compare by name.
- `pipeline_step(stages, actions, micro_batches, comm)`: one training step of one rank: run its
  action list (`camplib.parallel.pipeline.schedule`), forward receiving activations and sending
  outputs, backward receiving output gradients and sending input gradients
  (`camplib.parallel.pipeline.comm`). Each micro-batch's loss is divided by m, so the gradients
  are those of the mean loss over the whole batch: equal to one process's.
- `check_pipeline`: every size checked before any rank starts, with the numbers in the message.

The rank runner is `camplib.parallel.pipeline.run`.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from camplib.losses import cross_entropy
from camplib.parallel.pipeline.comm import PipelineComm
from camplib.parallel.pipeline.schedule import Action, stage_of

__all__ = ["InFlight", "PipelineStage", "check_pipeline", "pipeline_step", "split_layers", "stages_of_rank"]


def split_layers(n_layer: int, n_stages: int) -> list[range]:
    """Blocks per stage, consecutive and as even as possible (the first stages take one more)."""
    if n_stages < 1:
        raise ValueError(f"the number of pipeline stages must be >= 1, got {n_stages}")
    if n_stages > n_layer:
        raise ValueError(f"cannot split n_layer={n_layer} blocks into {n_stages} pipeline stages: "
                         "more stages than layers would leave some stage empty")
    base, extra = divmod(n_layer, n_stages)
    bounds, start = [], 0
    for s in range(n_stages):
        size = base + (s < extra)
        bounds.append(range(start, start + size))
        start += size
    return bounds


def check_pipeline(n_layer: int, batch: int, p: int, m: int, v: int = 1) -> None:
    """ValueError naming the numbers unless p ranks x v chunks fit n_layer and m divides batch."""
    for name, value in (("p (pipeline ranks)", p), ("m (micro-batches)", m), ("v (chunks per rank)", v)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    split_layers(n_layer, p * v)
    if batch % m:
        raise ValueError(f"the batch of {batch} sequences cannot be cut into m={m} equal micro-batches: "
                         f"{batch} % {m} = {batch % m}")


class InFlight:
    """Counts the micro-batches whose activations a rank holds: +1 at a stage's forward, -1 when
    the gradient of that forward's output arrives (its backward starts). `peak` is the most at once."""

    def __init__(self):
        self.now, self.peak = 0, 0

    def forward_done(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def backward_started(self, _grad=None) -> None:
        self.now -= 1


class PipelineStage(nn.Module):
    """Stage `index` of `n_stages` of a dense GPT (its modules, shared: not copies).

    forward(x, targets=None): the first stage takes token ids (B, T); the others take the
    previous stage's (B, T, d_model) activation. The last stage returns the mean cross-entropy
    over targets (its logits when targets is None); the others their output activation."""

    def __init__(self, gpt: nn.Module, index: int, n_stages: int, in_flight: InFlight | None = None):
        super().__init__()
        layers = split_layers(gpt.config.n_layer, n_stages)[index]
        self.index, self.n_stages = index, n_stages
        self.is_first, self.is_last = index == 0, index == n_stages - 1
        self.max_seq_len = gpt.config.max_seq_len
        if self.is_first:
            self.tok_emb, self.pos_emb, self.drop = gpt.tok_emb, gpt.pos_emb, gpt.drop
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[i] for i in layers})  # names as in the dense GPT
        if self.is_last:
            self.ln_f, self.lm_head = gpt.ln_f, gpt.lm_head
        self.in_flight = in_flight

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.is_first:
            T = x.size(1)
            if T > self.max_seq_len:
                raise ValueError(f"sequence of {T} tokens exceeds max_seq_len={self.max_seq_len}")
            h = self.tok_emb(x)
            if self.pos_emb is not None:
                h = h + self.pos_emb(torch.arange(T, device=x.device))
            x = self.drop(h)
        for block in self.blocks.values():
            x = block(x)
        if self.is_last:
            x = self.lm_head(self.ln_f(x))
            if targets is not None:
                x = cross_entropy(x.to(torch.promote_types(x.dtype, torch.float32)), targets, ignore_index=-100)
        if self.in_flight is not None and torch.is_grad_enabled():
            self.in_flight.forward_done()
            x.register_hook(self.in_flight.backward_started)
        return x


def pipeline_step(stages: dict[int, PipelineStage], actions: list[Action], micro_batches: list[tuple],
                  comm: PipelineComm, events: list | None = None) -> torch.Tensor:
    """Run this rank's `actions` once: gradients accumulate into the stages' parameters. Returns
    the loss of the whole batch (the mean of the micro-batch losses) on the last stage's rank,
    0 elsewhere. `micro_batches[i]` is (token ids, targets); `stages[chunk]` the rank's chunk.
    If `events` is a list, (action, start, end) in perf_counter seconds are appended to it: the
    compute of each action, from after its receive to after its send was posted."""
    m = len(micro_batches)
    stash: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    total = torch.zeros(())
    for a in actions:
        stage = stages[a.chunk]
        if a.kind == "F":
            idx, targets = micro_batches[a.mb]
            x = idx if stage.is_first else comm.recv_forward(a.mb, stage.index).requires_grad_()
            start = time.perf_counter()   # after the receive: waiting is bubble, not work
            if stage.is_last:
                out = stage(x, targets) / m
                total = total + out.detach()
            else:
                out = stage(x)
                comm.send_forward(out, a.mb, stage.index)
            stash[a.mb, a.chunk] = (x, out)
        else:
            x, out = stash.pop((a.mb, a.chunk))
            grad = None if stage.is_last else comm.recv_backward(a.mb, stage.index)
            start = time.perf_counter()
            out.backward(grad)
            if not stage.is_first:
                comm.send_backward(x.grad, a.mb, stage.index)
        if events is not None:
            events.append((a, start, time.perf_counter()))
    comm.finish()
    return total


def stages_of_rank(gpt: nn.Module, rank: int, p: int, v: int, in_flight: InFlight | None = None
                   ) -> dict[int, PipelineStage]:
    """{chunk: PipelineStage} of `rank`: global stages chunk * p + rank, chunk < v."""
    return {c: PipelineStage(gpt, stage_of(rank, c, p), p * v, in_flight) for c in range(v)}
