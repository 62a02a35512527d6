"""The generation engine: continuous batching over camplib's GPT with a paged KV cache.

`step()` is one iteration: the scheduler picks the rows, at most its token budget in all: the
newest token of every decoding sequence and the prompts (or chunks of prompts, chunked prefill)
of newly admitted ones go through the model together, in one forward over a flat batch of
tokens (camplib.serving.paged_model); each row whose sequence is now fully cached gets one
sampled token, and finished ones leave and free their blocks. A request therefore
joins the batch at the next step after it arrives and leaves the step it finishes, while the
others keep decoding. Greedy outputs are the same tokens as `camplib.generate.generate` gives
for each prompt alone (tests/camplib/serving/test_engine.py).

Thread safety: `add`/`abort` may be called from other threads (the HTTP server's event loop)
while one thread calls `step`; a lock guards the scheduler state.
"""
from __future__ import annotations

import threading
import time

import torch

from camplib.generate import sample
from camplib.serving.cpu_model import available as fast_cpu_available, for_cpu_serving
from camplib.serving.block_manager import BlockManager
from camplib.serving.compiled_step import CompiledDecode
from camplib.serving.kv_pool import PagedKVPool, pool_bytes_per_block
from camplib.serving.metrics import ServingMetrics
from camplib.serving.paged_model import Chunk, StepBatch, paged_forward
from camplib.serving.scheduler import Scheduler
from camplib.serving.sequence import SamplingParams, Sequence, Status

__all__ = ["Engine"]


class Engine:
    def __init__(self, model, *, block_size: int = 16, num_blocks: int | None = None,
                 kv_cache_bytes: int | None = None, max_batch: int = 32, max_waiting: int = 256,
                 max_step_tokens: int | None = None, metrics: ServingMetrics | None = None,
                 scheduler_cls=Scheduler, block_manager_cls=BlockManager, fast_cpu: bool = False,
                 compile_decode: bool = False):
        """The pool has num_blocks blocks; by default enough for max_batch sequences of max_seq_len
        tokens (no more can ever be in use), and at most as many as kv_cache_bytes holds.
        fast_cpu=True runs a copy of the model with weights packed for oneDNN and fewer kernels
        (camplib.serving.cpu_model: faster on a CPU, equal up to rounding); ignored where this torch
        or device cannot. max_step_tokens (default max_seq_len) caps the tokens of one step
        (vLLM's max_num_batched_tokens): a longer prompt is prefilled in chunks over several steps."""
        self.model = model.eval()
        cfg = self.config = model.config
        p = model.tok_emb.weight
        self.device, self.dtype = p.device, p.dtype
        self.fast_cpu = fast_cpu and fast_cpu_available(self.device, self.dtype)
        if self.fast_cpu:
            self.model = for_cpu_serving(self.model)
        self.bytes_per_block = pool_bytes_per_block(cfg, block_size, self.dtype)
        if num_blocks is None:
            num_blocks = max_batch * -(-cfg.max_seq_len // block_size)
            if kv_cache_bytes is not None:
                num_blocks = min(num_blocks, kv_cache_bytes // self.bytes_per_block)
            if num_blocks < 1:
                raise ValueError(f"a KV cache of {kv_cache_bytes} bytes holds no block of {self.bytes_per_block} bytes")
        self.blocks = block_manager_cls(num_blocks, block_size)
        self.pool = PagedKVPool(cfg, num_blocks, block_size, self.dtype, self.device)
        self.compiled = None
        if compile_decode:
            compiled = CompiledDecode(self.model, self.pool)
            self.compiled = compiled if compiled.compile() else None
        self.scheduler = scheduler_cls(self.blocks, max_batch=max_batch, max_waiting=max_waiting,
                                       max_step_tokens=max_step_tokens or cfg.max_seq_len)
        self.metrics = metrics
        self.lock = threading.Lock()
        self.steps = 0

    # requests ------------------------------------------------------------------------------
    def add(self, prompt: list[int], params: SamplingParams | None = None, on_token=None) -> Sequence:
        """Queue a request; raises ValueError (too long for the model or the cache) or QueueFull."""
        params = params or SamplingParams()
        if not prompt:
            raise ValueError("the prompt is empty")
        if len(prompt) + params.max_tokens > self.config.max_seq_len:
            raise ValueError(f"{len(prompt)} prompt tokens + max_tokens {params.max_tokens} exceed the "
                             f"context length {self.config.max_seq_len}")
        seq = Sequence(list(prompt), params, on_token)
        with self.lock:
            self.scheduler.add(seq)
        return seq

    def abort(self, seq: Sequence) -> None:
        """Drop a request (its client went away): it leaves the batch or queue, its blocks are freed."""
        with self.lock:
            if not seq.finished:
                self.scheduler.finish(seq, "abort")
                self._observe_finish(seq)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def kv_usage(self) -> dict:
        usage = self.blocks.usage()
        return {**usage, "bytes_in_use": usage["blocks_in_use"] * self.bytes_per_block,
                "pool_bytes": self.pool.nbytes, "block_size": self.blocks.block_size}

    # one iteration -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[Sequence]:
        """Run one scheduling + forward iteration; the sequences that got a token."""
        with self.lock:
            before = [(s, s.preemptions) for s in self.scheduler.running]
            rows = self.scheduler.schedule()
            now = time.monotonic()
            for s, _ in rows:
                s.scheduled_time = s.scheduled_time or now
            preempted = sum(s.preemptions > n for s, n in before)
            if not rows and self.scheduler.waiting:
                # nothing runs, yet the queue's head does not fit: a leak, not a busy server
                raise RuntimeError(f"{len(self.scheduler.waiting)} requests wait but none can be admitted: "
                                   f"{self.blocks.blocks_in_use} of {self.blocks.num_blocks} KV blocks are in use "
                                   f"with no sequence running (blocks never freed?)")
            # the block tables are read here, under the lock; the forward runs without it, so
            # the event loop can add or abort requests meanwhile (an abort frees blocks only
            # schedule() hands out again, on this thread)
            rows = sorted(rows, key=lambda r: not self._is_decode(*r))   # decode rows first, as the batch lays them
            batch = self._batch(rows) if rows else None
        logits = self._forward(batch) if rows else None
        done = []
        with self.lock:
            for s, n in rows:
                s.num_cached += n
            done = [(i, s) for i, (s, _) in enumerate(rows) if s.num_cached == len(s)]   # rows that reached its end
            first_prompts, generated = self._sample_and_finish(done, logits) if done else (0, 0)
            self.steps += 1
            if self.metrics is not None:
                self.metrics.on_step(running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
                                     blocks_in_use=self.blocks.blocks_in_use, num_blocks=self.blocks.num_blocks,
                                     bytes_per_block=self.bytes_per_block, preempted=preempted,
                                     prompt_tokens=first_prompts, generated=generated)
        return [s for _, s in done]

    def _forward(self, batch: StepBatch) -> torch.Tensor:
        """The step's logits: through the compiled graph where it has one for this step, else eager."""
        logits = self.compiled.run(batch) if self.compiled is not None else None
        return paged_forward(self.model, self.pool, batch) if logits is None else logits

    def _tensor(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    @staticmethod
    def _is_decode(seq: Sequence, n: int) -> bool:
        """One new token after a cached prefix: attends to its sequence's blocks, batched with the others."""
        return n == 1 and seq.num_cached > 0

    def _batch(self, rows: list[tuple[Sequence, int]]) -> StepBatch:
        """The step's flat batch: tokens num_cached .. num_cached + n - 1 of each row's sequence
        (decode rows first), written to the slots the scheduler reserved for them."""
        bs, tokens, positions, slots = self.blocks.block_size, [], [], []
        for s, n in rows:
            start = s.num_cached
            tokens += s.tokens[start:start + n]
            positions += range(start, start + n)
            slots += [block * bs + slot for block, slot in self.blocks.slots(s.id, start, start + n)]
        decode = [s for s, n in rows if self._is_decode(s, n)]
        chunks = [Chunk(n, s.num_cached, self._tensor([self.blocks.tables[s.id]]) if s.num_cached else None)
                  for s, n in rows[len(decode):]]
        batch = StepBatch(self._tensor(tokens), self._tensor(positions), self._tensor(slots), len(decode), chunks)
        if decode:   # the block tables of the decoding sequences, padded to the longest
            tables = [self.blocks.tables[s.id] for s in decode]
            width = max(map(len, tables))
            batch.tables = self._tensor([t + [t[0]] * (width - len(t)) for t in tables])
            lengths = self._tensor([s.num_cached + 1 for s in decode])
            cached = torch.arange(width * bs, device=self.device) < lengths[:, None]
            # additive (0 / -inf) rather than boolean: every decode row sees at least its own key,
            # so no row is all -inf and attend has no empty rows to patch up, layer after layer
            batch.context_mask = torch.zeros(cached.shape, dtype=self.dtype, device=self.device).masked_fill(
                ~cached, float("-inf"))[:, None, None, :]
        return batch

    def _sample_and_finish(self, done: list[tuple[int, Sequence]], logits: torch.Tensor) -> tuple[int, int]:
        """Append a sampled token to each sequence of `done` (row index in `logits`, sequence),
        retire finished ones; (prompt tokens of those that got their first token, tokens generated)."""
        rows = [s for _, s in done]
        index = [i for i, _ in done]
        greedy = [j for j, s in enumerate(rows) if s.params.temperature == 0]
        chosen = [0] * len(rows)
        if greedy:   # max(dim).indices: argmax's first index among ties, ~3x faster over a 49k vocabulary
            picked = [index[j] for j in greedy]
            rows_logits = logits if picked == list(range(len(logits))) else logits[picked]   # most steps: every row, no copy
            for j, tok in zip(greedy, rows_logits.max(dim=-1).indices.tolist()):
                chosen[j] = tok
        for j, s in enumerate(rows):
            if s.params.temperature != 0:
                p, i = s.params, index[j]
                chosen[j] = int(sample(logits[i:i + 1].float().cpu(), p.temperature, p.top_k, p.top_p, s.generator))
        now, first_prompts, generated = time.monotonic(), 0, 0
        for seq, tok in zip(rows, chosen):
            if seq.finished:
                continue   # aborted while the forward ran
            seq.output.append(tok)
            generated += 1
            if seq.first_token_time is None:
                first_prompts += len(seq.prompt)
            if self.metrics is not None:
                self.metrics.on_token(seq, now)
            seq.first_token_time = seq.first_token_time or now
            seq.last_token_time = now
            reason = ("stop" if tok in seq.params.stop_ids else
                      "length" if len(seq.output) >= seq.params.max_tokens or len(seq) >= self.config.max_seq_len
                      else None)
            if reason:
                self.scheduler.finish(seq, reason)
                self._observe_finish(seq)
            if seq.on_token is not None:
                seq.on_token(seq, tok)
        return first_prompts, generated

    def _observe_finish(self, seq: Sequence) -> None:
        if self.metrics is not None:
            self.metrics.on_finish(seq, time.monotonic())

    # offline use ---------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams | None = None,
                 max_steps: int = 100_000) -> list[list[int]]:
        """All prompts through the engine at once (continuous batching); their outputs, in order."""
        seqs = [self.add(p, params) for p in prompts]
        for _ in range(max_steps):
            if not self.has_work():
                break
            self.step()
        else:
            raise RuntimeError(f"not finished after {max_steps} steps")
        assert all(s.status is Status.FINISHED for s in seqs)
        return [s.output for s in seqs]
