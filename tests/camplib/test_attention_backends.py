"""camplib.attention.attend's three backends ("math", "flash", "sdpa") compute the same function:
outputs and gradients agree, alone and inside camplib's GPT (GPTConfig.attention)."""
import pytest
import torch

from camplib.attention import BACKENDS, MultiHeadAttention, attend
from camplib.model import GPT, GPTConfig
from tests.support import assert_close

# (atol, rtol) per dtype. Measured worst cases (this CPU, gradients included): fp32 1.4e-6, fp64 4.4e-15.
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-12, rtol=1e-10)}
OTHERS = [b for b in BACKENDS if b != "math"]


def attend_with_grads(backend, q, k, v, grad_out, **kwargs):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = attend(q, k, v, backend=backend, **kwargs)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), grad_out)]


@pytest.mark.parity
@pytest.mark.parametrize("backend", OTHERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["plain", "causal", "causal_cache", "padded_gqa", "causal_padded_cache_gqa"])
def test_backends_agree_with_math(backend, dtype, case):
    g = torch.Generator().manual_seed(len(case))
    B, H, Hkv, E = 2, 4, (2 if "gqa" in case else 4), 8
    S = 37
    T = 11 if "cache" in case else S          # with a cache the T new queries are the last T of S
    q = torch.randn(B, H, T, E, generator=g, dtype=dtype)
    k, v = (torch.randn(B, Hkv, S, E, generator=g, dtype=dtype) for _ in range(2))
    mask = None
    if "padded" in case:                      # left padding, as camplib.generate makes it
        mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
        mask[1, ..., :5] = False
    kwargs = dict(attn_mask=mask, is_causal="causal" in case)
    grad_out = torch.randn(B, H, T, E, generator=g, dtype=dtype)
    mine = attend_with_grads(backend, q, k, v, grad_out, **kwargs)
    ref = attend_with_grads("math", q, k, v, grad_out, **kwargs)
    for name, a, e in zip(["out", "dq", "dk", "dv"], mine, ref):
        assert_close(f"{name} ({backend}, {case}, {dtype})", a, e, **TOL[dtype])


@pytest.mark.parity
@pytest.mark.parametrize("backend", OTHERS)
@pytest.mark.parametrize("style", ["gpt2_style", "llama_style"])
def test_gpt_backends_give_equal_logits_and_gradients(backend, style):
    cfg = dict(vocab_size=50, n_layer=2, n_head=4, d_model=32, max_seq_len=40)
    if style == "llama_style":
        cfg["n_kv_head"] = 2
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 50, (2, 23), generator=g)
    attention_mask = torch.ones(2, 23, dtype=torch.long)
    attention_mask[0, :4] = 0                 # a left-padded row
    results = {}
    for name in ("math", backend):
        torch.manual_seed(0)
        model = GPT(getattr(GPTConfig, style)(attention=name, **cfg)).double()
        logits, loss = model(idx, idx, attention_mask=attention_mask)
        loss.backward()
        results[name] = {"logits": logits.detach(), **{n: p.grad for n, p in model.named_parameters()}}
    assert_close(f"GPT {style} with attention={backend!r} vs 'math'", results[backend], results["math"],
                 **TOL[torch.float64])


@pytest.mark.parity
@pytest.mark.parametrize("backend", OTHERS)
def test_cached_decoding_is_the_same_with_every_backend(backend):
    cfg = GPTConfig.llama_style(vocab_size=40, n_layer=1, n_head=4, n_kv_head=1, d_model=16, max_seq_len=20)
    logits = {}
    for name in ("math", backend):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**{**cfg.__dict__, "attention": name})).double().eval()
        caches = model.new_caches(1)
        with torch.no_grad():
            first, _ = model(torch.tensor([[1, 2, 3]]), caches=caches)
            second, _ = model(torch.tensor([[4]]), caches=caches)
        logits[name] = torch.cat([first, second], dim=1)
    assert_close(f"cached logits ({backend})", logits[backend], logits["math"], **TOL[torch.float64])


def test_flash_backend_refuses_what_it_cannot_compute():
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="only a bool key padding mask"):
        attend(q, k, v, torch.zeros(4, 4), backend="flash")
    with pytest.raises(ValueError, match="only a bool key padding mask"):
        attend(q, k, v, torch.ones(1, 1, 4, 4, dtype=torch.bool), backend="flash")
    with pytest.raises(ValueError, match="no dropout"):
        attend(q, k, v, backend="flash", dropout_p=0.1)


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="'fast'"):
        attend(*(torch.randn(1, 1, 2, 4) for _ in range(3)), backend="fast")
    with pytest.raises(ValueError, match="'fast'"):
        MultiHeadAttention(8, 2, backend="fast")
    with pytest.raises(ValueError, match="GPTConfig.attention='fast'"):
        GPTConfig(attention="fast")
