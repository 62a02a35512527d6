"""The engine's contract: continuous batching over the paged KV cache changes nothing in what
is generated. Greedy outputs equal camplib.generate.generate's for each prompt alone (token for
token), with requests joining mid-batch, blocks smaller than the prompts and preemptions; every
block is free again afterwards."""
import pytest
import torch

from camplib.generate import generate
from camplib.model import GPT, GPTConfig
from camplib.serving import Engine, SamplingParams


def _model(style):
    torch.manual_seed(0)
    make = GPTConfig.gpt2_style if style == "gpt2" else GPTConfig.llama_style
    return GPT(make(vocab_size=64, max_seq_len=64, n_layer=2, d_model=32, n_head=4)).eval()


def _prompts(seed=1, lengths=(3, 17, 9, 1, 30, 5, 12)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 64, (n,), generator=g).tolist() for n in lengths]


def _alone(model, prompt, n):
    return generate(model, torch.tensor([prompt]), n)[0, len(prompt):].tolist()


@pytest.mark.parametrize("style, num_blocks", [("gpt2", 64), ("llama", 64), ("llama", 14)],
                         ids=["gpt2", "llama", "llama-tight-pool"])
def test_greedy_outputs_equal_unbatched_generate(style, num_blocks):
    model = _model(style)
    prompts = _prompts()
    engine = Engine(model, block_size=4, num_blocks=num_blocks, max_batch=4)
    out = engine.generate(prompts, SamplingParams(max_tokens=16))
    for i, p in enumerate(prompts):
        expected = _alone(model, p, 16)
        assert out[i] == expected, f"prompt {i} ({len(p)} tokens): engine {out[i]} != generate {expected}"
    assert engine.blocks.blocks_in_use == 0, f"{engine.blocks.blocks_in_use} KV blocks still in use after all finished"


def test_tight_pool_really_preempts_and_still_matches():
    model = _model("llama")
    prompts = _prompts(lengths=(20, 20, 20))
    engine = Engine(model, block_size=4, num_blocks=16, max_batch=3)
    seqs = [engine.add(p, SamplingParams(max_tokens=24)) for p in prompts]
    while engine.has_work():
        engine.step()
    assert sum(s.preemptions for s in seqs) > 0, "the pool of 16 blocks should force a preemption"
    for s, p in zip(seqs, prompts):
        assert s.output == _alone(model, p, 24), f"sequence {s.id} differs after {s.preemptions} preemptions"


def test_requests_join_between_steps_and_abort_frees_blocks():
    model = _model("gpt2")
    engine = Engine(model, block_size=4, num_blocks=64, max_batch=8)
    first = engine.add(_prompts(lengths=(5,))[0], SamplingParams(max_tokens=30))
    for _ in range(3):
        engine.step()
    late = engine.add(_prompts(seed=2, lengths=(6,))[0], SamplingParams(max_tokens=4))
    engine.step()
    assert len(late.output) == 1 and not first.finished, "a late request must start while the first still runs"
    in_use, held = engine.blocks.blocks_in_use, len(engine.blocks.tables[first.id])
    assert held == 2, f"5 prompt + 3 fed tokens fill 2 blocks of 4, the first holds {held}"
    engine.abort(first)
    assert first.finish_reason == "abort" and engine.blocks.blocks_in_use == in_use - held
    while engine.has_work():
        engine.step()
    assert late.finish_reason == "length" and late.output == _alone(model, late.prompt, 4)
    assert engine.blocks.blocks_in_use == 0


def test_stop_token_sampling_and_limits():
    model = _model("gpt2")
    engine = Engine(model, block_size=8, num_blocks=32, max_batch=4)
    prompt = _prompts(lengths=(4,))[0]
    greedy = _alone(model, prompt, 8)
    seq = engine.add(prompt, SamplingParams(max_tokens=8, stop_ids=(greedy[2],)))
    while engine.has_work():
        engine.step()
    stop_at = greedy.index(greedy[2]) + 1
    assert seq.output == greedy[:stop_at] and seq.finish_reason == "stop"
    a, b = (engine.generate([prompt], SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=7))[0]
            for _ in range(2))
    assert a == b and len(a) == 10, "a seeded sampled request must be reproducible"
    with pytest.raises(ValueError, match="context length 64"):
        engine.add([1] * 60, SamplingParams(max_tokens=8))
    with pytest.raises(ValueError, match="empty"):
        engine.add([], SamplingParams())
    usage = engine.kv_usage()
    assert usage["blocks_in_use"] == 0 and usage["pool_bytes"] == 2 * 2 * 32 * 8 * 32 * 4


def test_bf16_model_gets_a_bf16_pool_and_reports_its_bytes():
    """What the gpu profile would run (no GPU here): the pool follows the model's dtype and device,
    so bf16 halves the bytes per block; decoding runs and frees its blocks."""
    model = _model("llama")
    fp32 = Engine(model, block_size=4, num_blocks=8)
    bf16 = Engine(_model("llama").to(torch.bfloat16), block_size=4, num_blocks=8)
    assert bf16.pool.k.dtype == torch.bfloat16 and bf16.pool.k.device == next(bf16.model.parameters()).device
    assert 2 * bf16.bytes_per_block == fp32.bytes_per_block == 2 * 2 * 4 * 2 * 8 * 4   # k+v, layers, slots, kv heads, dim
    assert bf16.kv_usage()["pool_bytes"] == 8 * bf16.bytes_per_block
    out = bf16.generate(_prompts(lengths=(5, 9)), SamplingParams(max_tokens=6))
    assert [len(o) for o in out] == [6, 6] and bf16.blocks.blocks_in_use == 0


def test_greedy_picks_the_first_of_tied_logits_in_every_row_layout():
    """Greedy takes the first index among equal logits (argmax's rule, which generate follows),
    when every row of the step gets a token and when only some do (a chunk mid-prompt)."""
    from camplib.serving.sequence import Sequence

    engine = Engine(_model("gpt2"), block_size=4, num_blocks=8, max_batch=4)
    logits = torch.full((3, 64), -1.0)
    logits[0, [5, 9]] = 2.0
    logits[1, [0, 63]] = 0.5
    logits[2, [7, 8, 40]] = 3.0
    for done_rows, expected in [([0, 1, 2], [5, 0, 7]), ([2, 0], [7, 5])]:
        seqs = [Sequence([1, 2], SamplingParams(max_tokens=8)) for _ in done_rows]
        engine._sample_and_finish(list(zip(done_rows, seqs)), logits)
        assert [s.output for s in seqs] == [[t] for t in expected], f"rows {done_rows}: {[s.output for s in seqs]}"
