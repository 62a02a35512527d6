"""Chunked prefill: a prompt cut into chunks over several steps (each chunk attending to the
cached prefix gathered from its blocks plus itself) computes what the whole sequence does in
one ordinary forward with torch's SDPA, and gives the same greedy tokens as unchunked serving."""
import pytest
import torch

import camplib.serving.engine as engine_module
from camplib.generate import generate
from camplib.model import GPT, GPTConfig
from camplib.serving import Engine, SamplingParams


def _model(**overrides):
    torch.manual_seed(0)
    cfg = GPTConfig.llama_style(vocab_size=64, max_seq_len=64, n_layer=2, d_model=32, n_head=4, **overrides)
    return GPT(cfg).eval()


def _prompts(lengths, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 64, (n,), generator=g).tolist() for n in lengths]


def _recording(monkeypatch):
    """Every step's batch and logits, as the engine's forward returns them."""
    calls, forward = [], engine_module.paged_forward

    def record(model, pool, batch):
        logits = forward(model, pool, batch)
        calls.append((batch, logits))
        return logits
    monkeypatch.setattr(engine_module, "paged_forward", record)
    return calls


def test_chunks_over_a_cached_prefix_equal_sdpa_on_the_whole_sequence(monkeypatch):
    """13 prompt tokens under a budget of 5: chunks 0-4 (nothing cached), 5-9 and 10-12 (over
    the gathered prefix), then decode rows; each row's last logits against the model's forward
    with attention="sdpa" over all tokens up to it. Tolerance 1e-5 (fp32, logits of size ~1)."""
    model = _model(attention="sdpa")
    calls = _recording(monkeypatch)
    engine = Engine(model, block_size=4, num_blocks=16, max_batch=2, max_step_tokens=5)
    seq = engine.add(_prompts([13])[0], SamplingParams(max_tokens=4))
    while engine.has_work():
        engine.step()
    assert [(b.n_decode, [(c.length, c.cached) for c in b.chunks]) for b, _ in calls[:4]] == \
        [(0, [(5, 0)]), (0, [(5, 5)]), (0, [(3, 10)]), (1, [])], "the prompt should run as chunks 5, 5, 3, then decode"
    with torch.no_grad():
        reference = model(torch.tensor([seq.tokens]))[0][0]
    for step, (batch, logits) in enumerate(calls):
        position = int(batch.positions[-1])
        diff = (logits[-1] - reference[position]).abs().max().item()
        assert diff < 1e-5, f"step {step}, token {position}: paged logits vs SDPA forward differ by {diff:.2e} (tolerance 1e-5)"


@pytest.mark.parametrize("budget", [5, 7])
def test_chunked_prefill_gives_the_same_greedy_tokens_as_whole_prompts(budget, monkeypatch):
    """Prompts of 17, 9, 30, 12 and 3 tokens joining over time, a budget that splits them
    unevenly: token for token what unchunked serving and `generate` alone give."""
    model = _model()
    prompts = _prompts([17, 9, 30, 12, 3])
    params = SamplingParams(max_tokens=10)
    whole = Engine(model, block_size=4, num_blocks=64, max_batch=4).generate(prompts, params)
    calls = _recording(monkeypatch)
    engine = Engine(model, block_size=4, num_blocks=64, max_batch=4, max_step_tokens=budget)
    seqs = [engine.add(p, params) for p in prompts[:2]]
    engine.step()
    seqs += [engine.add(p, params) for p in prompts[2:]]
    while engine.has_work():
        engine.step()
    assert max(b.tokens.numel() for b, _ in calls) <= budget, f"a step ran more than its budget of {budget} tokens"
    assert any(c.cached > 0 for b, _ in calls for c in b.chunks), "no prompt was cut into chunks"
    assert engine.blocks.blocks_in_use == 0
    for s, p, w in zip(seqs, prompts, whole):
        alone = generate(model, torch.tensor([p]), 10)[0, len(p):].tolist()
        assert s.output == w == alone, f"prompt of {len(p)} tokens: chunked {s.output}, whole {w}, generate {alone}"
