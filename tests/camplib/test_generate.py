"""camplib.generate: logits processors equal to transformers' warpers, sampling with the right
statistics, greedy decoding with and without the KV cache, equal to HF generate, and
left-padded batches equal to generating each prompt alone. Tiny random models, no downloads."""
import math

import pytest
import torch

from autograder.checks import check_close
from camplib.generate import (
    apply_temperature,
    generate,
    greedy,
    sample,
    top_k_filter,
    top_p_filter,
)
from camplib.hf import from_hf
from camplib.model import GPT, GPTConfig

# Processors are compared exactly: same sort, same comparisons, so the same tokens are masked and
# the kept logits are untouched (temperature is one division, bit-identical to HF's).
# Sampling frequencies over N_DRAWS draws: each frequency has std <= sqrt(0.25 / N) = 0.0025;
# FREQ_ATOL is 6 such std, so a correct sampler fails about never, a wrong one (probs not
# renormalised, filter ignored, temperature applied twice) misses by 0.03 or more.
# fp32 logits of converted HF models (as in test_hf_exchange): measured differences up to 3e-6.
LOGIT_TOL = dict(atol=1e-5, rtol=1e-5)
N_DRAWS = 40_000
FREQ_ATOL = 0.015
VOCAB = 101

CONFIGS = {
    "gpt2": GPTConfig.gpt2_style(vocab_size=VOCAB, max_seq_len=64),
    "llama": GPTConfig.llama_style(vocab_size=VOCAB, max_seq_len=64),
}


def tiny_model(cfg, seed=1, std=0.1):
    """Weights larger than GPT-2's init give peaked logits, so argmax is well defined and the
    continuations vary (not one token repeated)."""
    torch.manual_seed(seed)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, std)
    return model


def random_logits(seed, shape=(6, VOCAB), scale=3.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def left_pad(prompts, pad_id=0):
    """(B, T) ids and (B, T) mask for prompts of different lengths, pads on the left."""
    T = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        idx[i, T - len(p):], mask[i, T - len(p):] = p, 1
    return idx, mask


# --- logits processors -------------------------------------------------------------------------

@pytest.mark.parity
@pytest.mark.parametrize("seed", range(3))
def test_processors_match_transformers_warpers(seed):
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )
    logits = random_logits(seed)
    ids = torch.zeros(6, 1, dtype=torch.long)  # HF processors take input_ids; warpers ignore them
    for t in [0.3, 1.0, 2.5]:
        assert torch.equal(apply_temperature(logits, t), TemperatureLogitsWarper(t)(ids, logits))
    for k in [1, 5, 40, VOCAB, VOCAB + 10]:
        assert torch.equal(top_k_filter(logits, k), TopKLogitsWarper(k)(ids, logits)), k
    for p in [0.0, 0.1, 0.5, 0.9, 0.99]:
        assert torch.equal(top_p_filter(logits, p), TopPLogitsWarper(p)(ids, logits)), p
    # the chain in transformers.generate's order: temperature, top-k, top-p
    chain = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.8)])
    ours = top_p_filter(top_k_filter(apply_temperature(logits, 0.7), 20), 0.8)
    assert torch.equal(ours, chain(ids, logits))


@pytest.mark.parity
def test_top_k_keeps_ties_like_transformers():
    from transformers.generation.logits_process import TopKLogitsWarper
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 2.0, 0.5]])
    # k=2: the two 3.0s; k=3: the k-th largest is 2.0, held by two tokens -> both kept (4 tokens)
    assert torch.isfinite(top_k_filter(logits, 2)).tolist() == [[False, True, False, True, False, False]]
    assert torch.isfinite(top_k_filter(logits, 3)).tolist() == [[False, True, True, True, True, False]]
    for k in range(1, 7):
        assert torch.equal(top_k_filter(logits, k), TopKLogitsWarper(k)(None, logits))


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])  # sorted: 0.5, 0.3, 0.15, 0.05
    logits = probs.log()[None]
    kept = {p: torch.isfinite(top_p_filter(logits, p))[0].tolist() for p in [0.0, 0.4, 0.79, 0.81, 0.96, 1.0]}
    assert kept[0.0] == [False, True, False, False]   # always at least the top token
    assert kept[0.4] == [False, True, False, False]   # 0.5 >= 0.4 already
    assert kept[0.79] == [False, True, False, True]   # 0.5 + 0.3 >= 0.79
    assert kept[0.81] == [False, True, True, True]    # needs 0.15 too
    assert kept[0.96] == [True, True, True, True]
    assert kept[1.0] == [True, True, True, True]
    # kept logits are unchanged (renormalising is softmax's job)
    assert torch.equal(top_p_filter(logits, 0.81)[0, 1:], logits[0, 1:])


@pytest.mark.parity
def test_top_p_at_the_exact_boundary_and_with_ties():
    from transformers.generation.logits_process import TopPLogitsWarper
    logits = torch.tensor([[4.0, 2.0, 1.0, 1.0]]).log()  # probabilities 1/2, 1/4, 1/8, 1/8: exact in binary
    kept = lambda p: torch.isfinite(top_p_filter(logits, p))[0].tolist()
    assert kept(0.5) == [True, False, False, False]   # the top token alone reaches p = 0.5 exactly
    assert kept(0.75) == [True, True, False, False]
    for p in (0.5, 0.75):
        assert torch.equal(top_p_filter(logits, p), TopPLogitsWarper(p)(None, logits))
    # 0.875 needs one of the two tied 1/8 tokens: we keep the lower id (transformers keeps the
    # higher one, an artefact of its ascending sort); either is a smallest set reaching p
    assert kept(0.875) == [True, True, True, False]
    assert torch.isfinite(TopPLogitsWarper(0.875)(None, logits)).sum() == 3


def test_processors_reject_bad_arguments():
    logits = random_logits(0)
    for bad in [lambda: top_k_filter(logits, 0), lambda: top_p_filter(logits, 1.5),
                lambda: apply_temperature(logits, 0.0), lambda: sample(logits, temperature=-1.0)]:
        with pytest.raises(ValueError):
            bad()


# --- sampling statistics ---------------------------------------------------------------------------

def empirical_frequencies(logits_row, **kw):
    draws = sample(logits_row.expand(N_DRAWS, -1), generator=torch.Generator().manual_seed(5), **kw)
    return torch.bincount(draws, minlength=logits_row.numel()).float() / N_DRAWS


@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.5), dict(temperature=2.0), dict(top_k=4),
                                dict(top_p=0.7), dict(temperature=1.5, top_k=5, top_p=0.9)],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_sampling_frequencies_follow_the_processed_softmax(kw):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2])
    t = kw.get("temperature", 1.0)
    processed = apply_temperature(logits, t)
    processed = top_k_filter(processed, kw["top_k"]) if "top_k" in kw else processed
    processed = top_p_filter(processed, kw["top_p"]) if "top_p" in kw else processed
    expected = processed.softmax(-1)
    freq = empirical_frequencies(logits, **kw)
    assert (freq[expected == 0] == 0).all(), "a filtered token was drawn"
    err = (freq - expected).abs().max().item()
    assert err < FREQ_ATOL, f"frequencies {freq.tolist()} vs probabilities {expected.tolist()} (max diff {err:.4f})"


def test_sampling_limits_equal_greedy():
    logits = random_logits(1)
    assert torch.equal(sample(logits, temperature=0), greedy(logits))
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        assert torch.equal(sample(logits, top_k=1, generator=g), greedy(logits))
        assert torch.equal(sample(logits, top_p=0.0, generator=g), greedy(logits))
        assert torch.equal(sample(logits, temperature=1e-3, generator=g), greedy(logits))


def test_sampling_uses_only_the_given_generator():
    logits = random_logits(2)
    state = torch.get_rng_state()
    a = sample(logits, generator=torch.Generator().manual_seed(11))
    b = sample(logits, generator=torch.Generator().manual_seed(11))
    assert torch.equal(a, b) and torch.equal(torch.get_rng_state(), state)


# --- generate ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_with_cache_equals_without(name):
    model = tiny_model(CONFIGS[name])
    prompt = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(2))
    cached = generate(model, prompt, 25)
    assert cached.shape == (3, 32) and torch.equal(cached[:, :7], prompt)
    assert torch.equal(cached, generate(model, prompt, 25, use_cache=False))
    # greedy: each new token is the argmax of a full forward pass over its prefix
    logits, _ = model(cached[:, :-1])
    assert torch.equal(logits[:, 6:].argmax(-1), cached[:, 7:])
    assert len(cached[0, 7:].unique()) > 3  # a real continuation
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(model, prompt, 64)


def test_logits_hook_forbids_tokens_and_sees_the_tokens_so_far():
    """logits_hook(tokens so far, logits) -> logits is applied before each choice: forbidding
    each row's first greedy token makes it never appear; with a no-op hook nothing changes."""
    model = tiny_model(CONFIGS["llama"])
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))
    plain = generate(model, prompt, 10)
    seen = []

    def noop(idx, logits):
        seen.append(idx.shape[1])
        return logits
    assert torch.equal(generate(model, prompt, 10, logits_hook=noop), plain) and seen == list(range(5, 15))
    banned = plain[:, 5]

    def forbid(idx, logits):
        return logits.index_fill(1, banned.unique(), float("-inf"))
    out = generate(model, prompt, 10, logits_hook=forbid)
    assert not any(int(t) in banned.tolist() for t in out[:, 5:].flatten()) and not torch.equal(out, plain)


@pytest.mark.parity
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_matches_transformers_generate_with_left_padding(name):
    from tests.camplib.test_hf_exchange import hf_gpt2, hf_llama, randomize_norms
    hf = randomize_norms(hf_gpt2() if name == "gpt2" else hf_llama())
    ours = from_hf(hf)
    g = torch.Generator().manual_seed(3)
    idx, mask = left_pad([torch.randint(1, VOCAB, (n,), generator=g) for n in (4, 9, 6)])
    expected = hf.generate(idx, attention_mask=mask, do_sample=False, max_new_tokens=20, pad_token_id=0)
    got = generate(ours, idx, 20, attention_mask=mask)
    assert torch.equal(got, expected), f"ours {got.tolist()}\nhf   {expected.tolist()}"
    assert len(got[0, 9:].unique()) > 3


@pytest.mark.parity
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_forward_with_positions_and_padding_mask_matches_transformers(name):
    """The two arguments generate passes to GPT.forward for left padding, checked against HF's
    position_ids / attention_mask with positions that are not a shifted 0, 1, 2... (RoPE only
    sees distances, so a constant shift would not show a mistake)."""
    from tests.camplib.test_hf_exchange import hf_gpt2, hf_llama, randomize_norms
    hf = randomize_norms(hf_gpt2() if name == "gpt2" else hf_llama())
    ours = from_hf(hf)
    g = torch.Generator().manual_seed(8)
    idx = torch.randint(0, VOCAB, (2, 8), generator=g)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])
    positions = torch.tensor([[0, 0, 0, 3, 4, 9, 10, 30], [0, 2, 4, 6, 8, 10, 12, 14]])
    with torch.no_grad():
        expected = hf(idx, attention_mask=mask, position_ids=positions).logits
        got, _ = ours(idx, attention_mask=mask, positions=positions)
    real = mask.bool()  # pad rows attend to nothing: their outputs are unused and differ by design
    check_close(f"{name} logits at real tokens", got[real], expected[real], **LOGIT_TOL)


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no_cache"])
@pytest.mark.parametrize("name", CONFIGS)
def test_left_padded_batch_equals_each_prompt_alone(name, use_cache):
    model = tiny_model(CONFIGS[name], seed=4)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g) for n in (3, 10, 6, 1)]
    idx, mask = left_pad(prompts)
    batch = generate(model, idx, 15, attention_mask=mask, use_cache=use_cache)
    for i, p in enumerate(prompts):
        alone = generate(model, p[None], 15)
        assert torch.equal(batch[i, 10:], alone[0, len(p):]), f"row {i} (prompt length {len(p)})"
    # a mask of all ones is the same as no mask
    full = torch.ones_like(idx)
    assert torch.equal(generate(model, idx, 5, attention_mask=full), generate(model, idx, 5))


def test_attention_mask_must_be_left_padding():
    model = tiny_model(CONFIGS["gpt2"])
    idx = torch.randint(0, VOCAB, (2, 5))
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    holes = torch.tensor([[0, 1, 0, 1, 1], [1, 1, 1, 1, 1]])
    for bad in [right, holes, torch.ones(2, 4)]:
        with pytest.raises(ValueError, match="attention_mask"):
            generate(model, idx, 3, attention_mask=bad)


@pytest.mark.parametrize("name", CONFIGS)
def test_sampling_generate(name):
    model = tiny_model(CONFIGS[name])
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(6))
    greedy_out = generate(model, prompt, 12)
    # top_k=1 leaves one token to draw: the argmax, whatever the temperature
    assert torch.equal(generate(model, prompt, 12, temperature=1.3, top_k=1,
                                generator=torch.Generator().manual_seed(0)), greedy_out)
    a, b, c = (generate(model, prompt, 12, temperature=1.0, top_p=0.95, generator=torch.Generator().manual_seed(s))
               for s in (7, 7, 8))
    assert torch.equal(a, b)  # reproducible with a seeded generator
    assert not torch.equal(a, c) and not torch.equal(a, greedy_out)  # and really random
    # cache or not, the same seed draws the same tokens (same distributions, same RNG use)
    assert torch.equal(a, generate(model, prompt, 12, top_p=0.95, temperature=1.0, use_cache=False,
                                   generator=torch.Generator().manual_seed(7)))


def test_eos_finishes_a_row_and_stops_early():
    model = tiny_model(CONFIGS["gpt2"])
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(9))
    ref = generate(model, prompt, 20)
    eos = ref[0, 8].item()  # row 0 emits it as its 4th new token
    first = [int((ref[i, 5:] == eos).nonzero()[0]) if (ref[i, 5:] == eos).any() else math.inf for i in range(2)]
    out = generate(model, prompt, 20, eos_id=eos)
    stop = min(max(first) + 1, 20)
    assert out.shape == (2, 5 + stop)  # stops once every row is finished
    for i in range(2):
        n = first[i]
        if n < stop:  # tokens up to and including eos as without eos_id, then eos padding
            assert torch.equal(out[i, 5:5 + n + 1], ref[i, 5:5 + n + 1]) and (out[i, 5 + n:] == eos).all()
        else:
            assert torch.equal(out[i], ref[i, :5 + stop])
