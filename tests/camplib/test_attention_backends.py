"""camplib.attention.attend's backends ("math", "matmul", "flash", "sdpa", and "auto", which picks matmul or sdpa:
camplib.attention_backend) compute the same function: outputs and gradients agree, alone and inside
camplib's GPT (GPTConfig.attention); "auto"'s choice is measured once per size class, cached and
overridable."""
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


# -- "auto": the measured, cached, overridable choice (camplib.attention_backend) ---------------------
@pytest.fixture
def fresh_choice(monkeypatch):
    from camplib import attention_backend
    monkeypatch.delenv(attention_backend.ENV, raising=False)
    attention_backend.forget()
    yield attention_backend
    attention_backend.forget()


def test_auto_measures_once_per_size_class_and_keeps_the_faster(fresh_choice, monkeypatch):
    """With the timings replaced (matmul faster below 256 keys, sdpa above) on a CPU said to have bf16:
    each (device, dtype, size class, backward) is measured once, at its class's shape, and the
    faster kept; fp32 and CUDA are "sdpa" without measuring, and so is a CPU without bf16
    instructions. (~0 s)"""
    calls = []

    def fake_measure(device, dtype, shape, backward=True, attend=None):
        calls.append((str(device), dtype, shape, backward))
        return {"matmul": 2e-3, "sdpa": 3e-3} if shape[3] <= 256 else {"matmul": 9e-3, "sdpa": 3e-3}

    monkeypatch.setattr(fresh_choice, "native_on_cpu", lambda dtype: True)
    monkeypatch.setattr(fresh_choice, "measure", fake_measure)
    assert fresh_choice.choose("cpu", torch.bfloat16, (4, 4, 100, 100, 32)) == "matmul"
    assert fresh_choice.choose(torch.device("cpu"), torch.bfloat16, (4, 4, 128, 128, 32)) == "matmul"   # same class
    assert fresh_choice.choose("cpu", torch.bfloat16, (4, 4, 512, 512, 32)) == "sdpa"
    assert fresh_choice.choose("cpu", torch.bfloat16, (4, 4, 1, 100, 32), backward=False) == "matmul"
    assert fresh_choice.choose("cpu", torch.float16, (4, 4, 100, 100, 32)) == "matmul"
    assert fresh_choice.choose("cpu", torch.float32, (4, 4, 100, 100, 32)) == "sdpa"
    assert fresh_choice.choose("cuda", torch.bfloat16, (4, 4, 100, 100, 32)) == "sdpa"
    assert calls == [("cpu", torch.bfloat16, (4, 4, 128, 128, 32), True), ("cpu", torch.bfloat16, (4, 4, 512, 512, 32), True),
                     ("cpu", torch.bfloat16, (4, 4, 1, 128, 32), False), ("cpu", torch.float16, (4, 4, 128, 128, 32), True)], calls
    assert fresh_choice.choices()[("cpu", torch.bfloat16, (4, 4, 128, 128, 32), True)] == {
        "backend": "matmul", "seconds": {"matmul": 2e-3, "sdpa": 3e-3}}
    fresh_choice.forget()
    monkeypatch.setattr(fresh_choice, "native_on_cpu", lambda dtype: False)
    assert fresh_choice.choose("cpu", torch.bfloat16, (4, 4, 100, 100, 32)) == "sdpa" and len(calls) == 4


def test_auto_is_overridable_in_code_and_by_the_environment(fresh_choice, monkeypatch):
    monkeypatch.setattr(fresh_choice, "measure", lambda *args, **kwargs: pytest.fail("an override must not measure"))
    monkeypatch.setenv(fresh_choice.ENV, "math")
    assert fresh_choice.choose("cpu", torch.float32) == "math"
    fresh_choice.prefer("sdpa", "cpu", torch.float32)          # code beats the environment
    assert fresh_choice.choose("cpu", torch.float32) == "sdpa" and fresh_choice.choose("cpu", torch.float64) == "math"
    fresh_choice.prefer("sdpa")                                 # any device, any dtype
    assert fresh_choice.choose("cuda", torch.bfloat16) == "sdpa"
    fresh_choice.prefer(None)
    fresh_choice.prefer(None, "cpu", torch.float32)
    assert fresh_choice.choose("cpu", torch.float32) == "math"
    with pytest.raises(ValueError, match="'flash'"):
        fresh_choice.prefer("flash")
    monkeypatch.setenv(fresh_choice.ENV, "fast")
    with pytest.raises(ValueError, match="'fast'"):
        fresh_choice.choose("cpu", torch.float32)


def test_auto_runs_what_it_chose_inside_the_model(fresh_choice, monkeypatch):
    """GPTConfig's default is "auto"; the model's attention then runs the chosen backend."""
    import camplib.attention as attention_module
    seen = []
    real = attention_module.scaled_dot_product_attention
    monkeypatch.setattr(attention_module, "scaled_dot_product_attention",
                        lambda *a, **kw: seen.append("math") or real(*a, **kw))
    model = GPT(GPTConfig.gpt2_style(vocab_size=20, n_layer=1, d_model=16, max_seq_len=8))
    assert model.config.attention == "auto"
    idx = torch.zeros(1, 8, dtype=torch.long)
    model(idx)
    assert seen == []                                   # fp32 on the CPU: torch's fused kernel
    fresh_choice.prefer("math", "cpu", torch.float32)
    model(idx)
    assert seen == ["math"]


def test_measure_times_both_backends_for_real():
    """The real timing (fp32, cheap here): both backends timed, positive, finite. (~0.3 s)"""
    from camplib.attention_backend import measure
    seconds = measure("cpu", torch.float32, (2, 2, 64, 64, 16), rounds=1, attend=attend)
    assert sorted(seconds) == ["matmul", "sdpa"] and all(0 < s < 60 for s in seconds.values()), seconds


@pytest.mark.skipif(not __import__("camplib.attention_backend").attention_backend.native_on_cpu(torch.bfloat16),
                    reason="this CPU has no bf16 instructions (AVX512-BF16 / AMX): 'auto' does not measure bf16 here")
def test_auto_measures_bf16_on_a_bf16_cpu(fresh_choice):
    choice = fresh_choice.choose("cpu", torch.bfloat16, (2, 4, 128, 128, 32), attend=attend)
    measured = fresh_choice.choices()[("cpu", torch.bfloat16, (2, 4, 128, 128, 32), True)]
    assert choice == min(measured["seconds"], key=measured["seconds"].get), measured
