"""One request as the engine sees it: its tokens so far, how far its KV is cached, when to stop,
how to sample, and timestamps for the latency metrics."""
from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

__all__ = ["Sequence", "Status", "SamplingParams"]

_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0          # 0: greedy
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_ids: tuple[int, ...] = ()    # e.g. the tokenizer's end-of-sequence id


@dataclass(eq=False)
class Sequence:
    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    on_token: Callable[["Sequence", int], None] | None = None   # called by the engine's thread
    id: int = field(default_factory=lambda: next(_ids))
    output: list[int] = field(default_factory=list)
    num_cached: int = 0               # tokens whose keys/values are in the KV cache (chunked prefill)
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    arrival: float = field(default_factory=time.monotonic)
    scheduled_time: float | None = None      # first admitted into the batch (not re-admissions)
    first_token_time: float | None = None
    last_token_time: float | None = None
    preemptions: int = 0
    generator: torch.Generator | None = None

    def __post_init__(self):
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def __len__(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
