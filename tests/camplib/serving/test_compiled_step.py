"""The compiled decoding step (camplib.serving.compiled_step) changes how fast a step runs, not
what it computes: one compile serves steps of every batch size and table width (1 row and 1
block included), logits equal the eager step's within 1e-4, greedy outputs equal the eager
engine's token for token, and a step the graph does not fit, or a compile that fails, runs eager."""
import contextlib
import warnings

import pytest
import torch

import camplib.serving.engine as engine_module
from camplib.serving import Engine, SamplingParams
from camplib.serving.paged_model import paged_forward
from tests.camplib.serving.test_engine import _model, _prompts

# (prompt length, max_tokens): a 1-token prompt decodes alone in 1 block first; then 4 at a time,
# finishing at different steps, down to 1 row over 8-11 blocks
REQUESTS = [[(1, 6)], [(3, 14), (17, 4), (9, 20), (1, 9), (30, 12), (5, 25), (2, 3)]]


@pytest.fixture(scope="module")
def compiled_engine():
    engine = Engine(_model("llama"), block_size=4, num_blocks=40, max_batch=4, compile_decode=True)
    assert engine.compiled is not None, "the decoding step did not compile on this machine"
    return engine


def _run(engine, requests, seed):
    prompts = _prompts(seed=seed, lengths=[n for n, _ in requests])
    seqs = [engine.add(p, SamplingParams(max_tokens=m)) for p, (_, m) in zip(prompts, requests)]
    while engine.has_work():
        engine.step()
    return [s.output for s in seqs]


@contextlib.contextmanager
def _decoding(engine, lengths, seed):
    """The batch of the step after these prompts' prefill (every row decodes); aborted after."""
    seqs = [engine.add(p, SamplingParams(max_tokens=8)) for p in _prompts(seed=seed, lengths=lengths)]
    try:
        engine.step()
        with engine.lock:
            batch = engine._batch(engine.scheduler.schedule())
        yield batch
    finally:
        with engine.lock:
            for s in seqs:
                engine.scheduler.finish(s, "abort")


def test_greedy_outputs_equal_the_eager_engine(compiled_engine, monkeypatch):
    eager = Engine(_model("llama"), block_size=4, num_blocks=40, max_batch=4)
    want = [_run(eager, requests, seed) for seed, requests in enumerate(REQUESTS)]
    compiled = compiled_engine.compiled
    runs, shapes, graph, eager_steps = compiled.runs, set(), compiled._compiled, []

    def recorded(tokens, positions, slots, tables, mask):
        shapes.add((len(tokens), tables.shape[1]))
        return graph(tokens, positions, slots, tables, mask)

    def counted(model, pool, batch):
        eager_steps.append(not batch.chunks)
        return paged_forward(model, pool, batch)
    monkeypatch.setattr(compiled, "_compiled", recorded)
    monkeypatch.setattr(engine_module, "paged_forward", counted)
    got = [_run(compiled_engine, requests, seed) for seed, requests in enumerate(REQUESTS)]
    for phase, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            assert a == b, f"phase {phase}, request {i} {REQUESTS[phase][i]}: compiled {a} != eager {b}"
    assert compiled.runs - runs >= 30, f"only {compiled.runs - runs} steps ran compiled"
    assert not any(eager_steps), f"{sum(eager_steps)} all-decode steps ran eager"
    assert eager_steps, "no step with prompt chunks ran eager"
    assert compiled.fallbacks == 0
    # the graph's rows (a single row runs as two copies) and blocks per row
    rows, widths = {b for b, _ in shapes}, {w for _, w in shapes}
    assert {2, 3, 4} <= rows and 1 in widths and max(widths) >= 8, f"compiled steps' (rows, blocks): {sorted(shapes)}"
    assert compiled_engine.blocks.blocks_in_use == 0


@pytest.mark.parametrize("lengths", [(2,), (6, 11), (3, 14, 9)], ids=["1-row", "2-rows", "3-rows"])
def test_logits_equal_the_eager_step_within_1e_4(compiled_engine, lengths):
    with _decoding(compiled_engine, lengths, seed=len(lengths)) as batch, torch.no_grad():
        assert batch.n_decode == len(lengths) and not batch.chunks
        want = paged_forward(compiled_engine.model, compiled_engine.pool, batch)
        got = compiled_engine.compiled.run(batch)
    assert got is not None and got.shape == want.shape, f"compiled logits {None if got is None else got.shape}"
    diff = (got - want).abs().max().item()
    assert diff <= 1e-4, f"{len(lengths)} rows: compiled logits differ from eager by {diff:.2e}"


def test_a_step_the_graph_does_not_fit_runs_eager(compiled_engine):
    with _decoding(compiled_engine, (4, 7), seed=5) as batch, torch.no_grad():
        batch.tables = batch.tables.to(torch.int32)   # another dtype: the graph would need compiling again
        before = compiled_engine.compiled.fallbacks
        assert compiled_engine.compiled.run(batch) is None
    assert compiled_engine.compiled.fallbacks == before + 1


def test_a_compile_that_fails_warns_and_serves_eager(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler here")
    monkeypatch.setattr(torch, "compile", broken)
    with pytest.warns(RuntimeWarning, match="could not be compiled.*no C\\+\\+ compiler"):
        engine = Engine(_model("llama"), block_size=4, num_blocks=20, max_batch=2, compile_decode=True)
    assert engine.compiled is None
    eager = Engine(_model("llama"), block_size=4, num_blocks=20, max_batch=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _run(engine, REQUESTS[1][:3], 0) == _run(eager, REQUESTS[1][:3], 0)
