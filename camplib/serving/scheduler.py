"""Continuous batching (Orca, Yu et al. 2022): between two decoding steps, finished requests
leave the running batch and waiting ones join it, instead of the whole batch waiting for its
slowest member (static batching). The lab p03 has students write this and the block manager.

Each step, `schedule()`:
1. reserves a KV slot for the next token of every running sequence; when no block is free it
   *preempts* the newest running sequence (frees its blocks, puts it back at the head of the
   queue; later its prompt and output are recomputed in one prefill, so greedy outputs stay the
   same), as vLLM does by default;
2. admits waiting sequences, oldest first, while the batch has room (`max_batch`), the step's
   prefill budget (`max_prefill_tokens`) allows and their prompt's blocks are free.
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
                 max_prefill_tokens: int = 2048):
        if max_batch < 1 or max_waiting < 0 or max_prefill_tokens < 1:
            raise ValueError(f"need max_batch >= 1, max_waiting >= 0, max_prefill_tokens >= 1, got "
                             f"{max_batch}, {max_waiting}, {max_prefill_tokens}")
        self.blocks, self.max_batch = blocks, max_batch
        self.max_waiting, self.max_prefill_tokens = max_waiting, max_prefill_tokens
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

    def schedule(self) -> tuple[list[Sequence], list[Sequence]]:
        """(sequences to prefill, sequences to decode one token) for the next step."""
        decode = self._reserve_decode_slots()
        prefill, budget = [], self.max_prefill_tokens
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            n = len(seq)
            if (n > budget and prefill) or not self.blocks.can_allocate(n):
                break  # first come, first served: no overtaking of the head of the queue
            self.waiting.popleft()
            self.blocks.allocate(seq.id, n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            prefill.append(seq)
            budget -= n
        return prefill, decode

    def _reserve_decode_slots(self) -> list[Sequence]:
        decode = []
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:
                continue  # preempted below while reserving for an older one
            while self.blocks.needs_new_block(seq.id) and self.blocks.num_free == 0:
                self._preempt(self.running[-1])
                if seq.status is not Status.RUNNING:
                    break
            if seq.status is Status.RUNNING:
                self.blocks.append(seq.id)
                decode.append(seq)
        return decode

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.id)
        seq.status, seq.preemptions = Status.WAITING, seq.preemptions + 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """A sequence is done (stop token, length, client gone): it leaves and frees its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq.id)
        seq.status, seq.finish_reason = Status.FINISHED, reason
