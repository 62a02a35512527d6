"""Lab p03's runner: camplib's engine with the classes it is given, driven step by step with
requests that arrive (and clients that leave) at chosen steps, recorded as plain data that
matches what actually happened: outputs equal to unbatched generate, first tokens at arrival,
block accounting per step, the given classes really used."""
from collections import deque
from dataclasses import asdict

import pytest
import torch

from camplib.generate import generate
from camplib.model import GPT, GPTConfig
from camplib.serving.block_manager import BlockManager
from camplib.serving.harness import model_from, run_requests
from camplib.serving.scheduler import Scheduler


def _model():
    torch.manual_seed(0)
    cfg = GPTConfig.llama_style(vocab_size=64, max_seq_len=64, n_layer=2, d_model=32, n_head=4)
    model = GPT(cfg).eval()
    return asdict(cfg), model, {n: p.detach().clone() for n, p in model.named_parameters()}


REQUESTS = [{"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 6, "arrival": 0},
            {"prompt": [9, 10], "max_tokens": 8, "arrival": 2},
            {"prompt": [11, 12, 13], "max_tokens": 8, "arrival": 3, "abort_at": 6}]


def _alone(model, r):
    return generate(model, torch.tensor([r["prompt"]]), r["max_tokens"])[0, len(r["prompt"]):].tolist()


def test_record_matches_generate_arrivals_and_block_accounting():
    config, model, params = _model()
    rec = run_requests(config, params, REQUESTS, block_size=4, num_blocks=32, max_batch=4)
    for i, r in enumerate(REQUESTS):
        expected = _alone(model, r)
        got = rec["outputs"][i]
        assert got == expected[:len(got)] and (r.get("abort_at") or len(got) == r["max_tokens"]), (i, got, expected)
    assert rec["finish_reasons"] == ["length", "length", "abort"]
    assert rec["first_token_step"] == [0, 2, 3], "with room in the batch a request starts at the step it arrives"
    assert len(rec["outputs"][2]) == 3, "aborted before step 6: tokens from steps 3, 4 and 5"
    for step, s in enumerate(rec["steps"]):
        need = sum(-(-n // 4) for n in s["lengths"].values())
        assert s["blocks_in_use"] == need, f"step {step}: {s}"
    assert rec["steps"][0]["lengths"] == {"0": 8}, "8 prompt tokens cached after the prefill step, the 9th just sampled"
    assert rec["blocks_in_use_end"] == 0 and rec["num_blocks"] == 32


class _CountingBlocks(BlockManager):
    allocations = 0

    def allocate(self, seq_id, n_tokens):
        type(self).allocations += 1
        return super().allocate(seq_id, n_tokens)


class _StaticBatching(Scheduler):
    """Admits only when the batch is empty: what the lab's tests must tell apart."""

    def schedule(self):
        if not self.running:
            return super().schedule()
        waiting, self.waiting = self.waiting, deque()   # the queue hidden while anyone runs
        try:
            return super().schedule()
        finally:
            self.waiting = waiting


def test_given_classes_are_the_ones_used():
    config, _, params = _model()
    rec = run_requests(config, params, REQUESTS[:2], block_manager=_CountingBlocks, scheduler=_StaticBatching,
                       block_size=4, num_blocks=32, max_batch=4)
    assert _CountingBlocks.allocations == 2
    assert rec["first_token_step"] == [0, 6], "static batching: the second request waits for the first to finish"


def test_bad_parameters_and_endless_runs_are_clear_errors():
    config, _, params = _model()
    with pytest.raises(ValueError, match="missing"):
        model_from(config, {k: v for k, v in params.items() if k != "tok_emb.weight"})
    with pytest.raises(RuntimeError, match="not finished after 3 steps"):
        run_requests(config, params, REQUESTS[:1], max_steps=3)
