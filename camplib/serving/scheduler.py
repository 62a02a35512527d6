"""Continuous batching (Orca, Yu et al. 2022) with chunked prefill (Sarathi, Agrawal et al. 2023):
between two steps, finished requests leave the running batch and waiting ones join it, instead
of the whole batch waiting for its slowest member (static batching). The lab p03 has students
write this and the block manager.

A step computes at most `max_step_tokens` tokens. Each sequence counts the tokens whose
keys/values are already cached (`num_cached`); a *row* of the step, (sequence, n), computes its
next n uncached tokens. A decoding sequence has one uncached token (the one sampled last step);
a new prompt has many, and when they do not fit in what is left of the budget, the prompt is cut
into chunks over several steps: a long prompt no longer stalls everyone's next token, and the
token is sampled once a row reaches the sequence's end. `schedule()`:
1. rows of the running sequences, decoders first, then prompts admitted earlier and not fully
   cached, while the budget lasts. A decode row needs a KV slot for its token; when no block is
   free the *newest* running sequence is preempted (its blocks freed, back at the head of the
   queue, `num_cached` 0: its prompt and output are recomputed later, so greedy outputs stay the
   same), as vLLM does by default;
2. admits waiting sequences, oldest first, while the batch has room (`max_batch`), budget is left
   and the blocks of their whole prompt are free (so a chunk never waits for blocks).
The engine runs the rows and adds n to each sequence's `num_cached`.
`add` refuses (QueueFull) beyond `max_waiting` queued requests (not counting those the next
step admits into free batch slots): a request storm gets a clear "try later" instead of
unbounded memory.
"""
from __future__ import annotations

from collections import deque

from camplib.serving.block_manager import BlockManager
from camplib.serving.sequence import Sequence, Status

__all__ = ["Scheduler", "QueueFull"]


class QueueFull(RuntimeError):
    """More requests are waiting than the queue limit allows (HTTP 429)."""


class Scheduler:
    def __init__(self, blocks: BlockManager, max_batch: int = 32, max_waiting: int = 256,
                 max_step_tokens: int = 2048):
        if max_batch < 1 or max_waiting < 0 or max_step_tokens < 1:
            raise ValueError(f"need max_batch >= 1, max_waiting >= 0, max_step_tokens >= 1, got "
                             f"{max_batch}, {max_waiting}, {max_step_tokens}")
        self.blocks, self.max_batch = blocks, max_batch
        self.max_waiting, self.max_step_tokens = max_waiting, max_step_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        # requests the next step admits into free batch slots are not queued: a burst of up to
        # max_batch - running + max_waiting requests arriving between two steps is accepted
        limit = self.max_waiting + max(0, self.max_batch - len(self.running))
        if len(self.waiting) >= limit:
            raise QueueFull(f"{len(self.waiting)} requests already waiting (limit {self.max_waiting} "
                            f"beyond the {self.max_batch - len(self.running)} free batch slots)")
        if self.blocks.blocks_needed(len(seq) + seq.params.max_tokens) > self.blocks.num_blocks:
            raise ValueError(f"a request of {len(seq)} + {seq.params.max_tokens} tokens needs more KV blocks "
                             f"than the whole cache has ({self.blocks.num_blocks} of {self.blocks.block_size})")
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The next step's rows: (sequence, n) computes its tokens num_cached .. num_cached + n - 1."""
        rows, budget = [], self.max_step_tokens
        for seq in sorted(self.running, key=lambda s: len(s) - s.num_cached > 1):   # decoders first
            n = min(len(seq) - seq.num_cached, budget)
            if seq.status is Status.RUNNING and n > 0 and self._reserve(seq, seq.num_cached + n):
                rows.append((seq, n))
                budget -= n
        while self.waiting and len(self.running) < self.max_batch and budget > 0:
            seq = self.waiting[0]
            if not self.blocks.can_allocate(len(seq)):
                break  # first come, first served: no overtaking of the head of the queue
            self.waiting.popleft()
            self.blocks.allocate(seq.id, len(seq))
            seq.status = Status.RUNNING
            self.running.append(seq)
            rows.append((seq, min(len(seq), budget)))
            budget -= rows[-1][1]
        return rows

    def _reserve(self, seq: Sequence, n_tokens: int) -> bool:
        """KV slots for a sequence's first n_tokens, preempting the newest running sequence while
        no block is free; False if that preempted `seq` itself."""
        while self.blocks.lengths[seq.id] < n_tokens:
            while self.blocks.needs_new_block(seq.id) and self.blocks.num_free == 0:
                self._preempt(self.running[-1])
                if seq.status is not Status.RUNNING:
                    return False
            self.blocks.append(seq.id)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.id)
        seq.status, seq.preemptions, seq.num_cached = Status.WAITING, seq.preemptions + 1, 0
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """A sequence is done (stop token, length, client gone): it leaves and frees its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq.id)
        seq.status, seq.finish_reason = Status.FINISHED, reason
