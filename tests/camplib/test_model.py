"""camplib.model (GPT-2 / Llama style decoder) and camplib.device."""
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from autograder.checks import check_close
from camplib.device import autocast_dtype, pick_device, seed_everything
from camplib.generate import generate
from camplib.model import GPT, GPTConfig, RMSNorm, count_parameters

# (atol, rtol) per dtype for every comparison in this file
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-12, rtol=1e-10)}

CONFIGS = {
    "gpt2": GPTConfig.gpt2_style(),
    "gpt2_untied_nobias": GPTConfig.gpt2_style(tie_embeddings=False, bias=False, d_ff=100),
    "gpt2_exact_gelu_gqa": GPTConfig.gpt2_style(n_head=8, n_kv_head=2, gelu_approximate="none"),
    "llama": GPTConfig.llama_style(),
    "llama_tied_bias_mha": GPTConfig.llama_style(n_kv_head=None, tie_embeddings=True, bias=True),
    "llama_mqa_rmsnorm_learned": GPTConfig.llama_style(n_kv_head=1, pos="learned", n_layer=3, d_ff=72),
    "mixed": GPTConfig(norm="rmsnorm", mlp="gelu", pos="rope", bias=True, tie_embeddings=False),
}


def tiny_model(cfg, seed=0, std=None):
    torch.manual_seed(seed)
    model = GPT(cfg).eval()
    if std is not None:  # larger weights than GPT-2's init give peaked logits, so argmax is well defined
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, std)
    return model


@pytest.mark.parametrize("name", CONFIGS)
def test_count_parameters_formula_matches_model(name):
    cfg = CONFIGS[name]
    model = GPT(cfg)
    unique = {id(p): p.numel() for p in model.parameters()}  # tied tensors once
    assert count_parameters(cfg) == model.num_parameters() == sum(unique.values())
    emb = cfg.vocab_size * cfg.d_model + (cfg.max_seq_len * cfg.d_model if cfg.pos == "learned" else 0)
    assert count_parameters(cfg, exclude_embeddings=True) == model.num_parameters(exclude_embeddings=True)
    assert model.num_parameters() - model.num_parameters(exclude_embeddings=True) == emb
    assert (model.lm_head.weight is model.tok_emb.weight) == cfg.tie_embeddings


def test_count_parameters_by_hand():
    # GPT-2 style, d=8, 1 layer, vocab 10, 4 positions, d_ff 32, 2 heads:
    # embeddings 10*8 + 4*8; attention 8*24+24 + 8*8+8; mlp 8*32+32 + 32*8+8; 2 LNs 2*16; ln_f 16
    cfg = GPTConfig.gpt2_style(vocab_size=10, max_seq_len=4, d_model=8, n_head=2, n_layer=1)
    assert count_parameters(cfg) == 80 + 32 + (192 + 24 + 64 + 8) + (256 + 32 + 256 + 8) + 32 + 16


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_forward_shapes_and_loss(name):
    cfg = CONFIGS[name]
    model = tiny_model(cfg)
    seq = torch.randint(0, cfg.vocab_size, (3, 11))
    logits, loss = model(seq[:, :-1])
    assert logits.shape == (3, 10, cfg.vocab_size) and loss is None
    targets = seq[:, 1:].clone()
    targets[0, :4] = -100  # ignored positions (e.g. a prompt that is not trained on)
    logits, loss = model(seq[:, :-1], targets)
    expected = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1), ignore_index=-100)
    check_close("loss", loss, expected, **TOL[torch.float32])
    # the same loss by hand: mean over kept positions of -log p(target)
    logp = logits.log_softmax(-1)
    keep = targets != -100
    by_hand = -logp[keep].gather(1, targets[keep][:, None]).mean()
    check_close("loss by hand", loss, by_hand, **TOL[torch.float32])
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name", CONFIGS)
def test_causality_and_cached_forward(name):
    cfg = CONFIGS[name]
    model = tiny_model(cfg, std=0.1).double()
    seq = torch.randint(0, cfg.vocab_size, (2, 12))
    full, _ = model(seq)
    changed = seq.clone()
    changed[:, 8] = (changed[:, 8] + 1) % cfg.vocab_size
    assert torch.equal(model(changed)[0][:, :8], full[:, :8])  # the future cannot leak back
    caches = model.new_caches(2, 12)
    with torch.no_grad():
        parts = [model(seq[:, :5], caches=caches)[0]]  # prefill, then one token at a time
        parts += [model(seq[:, t:t + 1], caches=caches)[0] for t in range(5, 12)]
    check_close("logits with KV cache", torch.cat(parts, 1), full.detach(), **TOL[torch.float64])


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_generate_cache_equals_no_cache(name):
    """The KV cache of every model variant: camplib.generate's greedy decoding gives the same
    tokens with and without it."""
    cfg = CONFIGS[name]
    model = tiny_model(cfg, seed=1, std=0.1)
    prompt = torch.randint(0, cfg.vocab_size, (2, 6))
    with_cache = generate(model, prompt, 20)
    without = generate(model, prompt, 20, use_cache=False)
    assert with_cache.shape == (2, 26) and torch.equal(with_cache[:, :6], prompt)
    assert torch.equal(with_cache, without)
    # and it is greedy: each new token is the argmax of a full forward pass over its prefix
    logits, _ = model(with_cache[:, :-1])
    assert torch.equal(logits[:, 5:].argmax(-1), with_cache[:, 6:])
    assert len(with_cache[0, 6:].unique()) > 1  # not a degenerate constant continuation
    with pytest.raises(ValueError):
        generate(model, prompt, cfg.max_seq_len)


@pytest.mark.parity
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rmsnorm_matches_torch(dtype):
    torch.manual_seed(0)
    ours, ref = RMSNorm(24, eps=1e-6).to(dtype), torch.nn.RMSNorm(24, eps=1e-6, dtype=dtype)
    with torch.no_grad():
        ours.weight.normal_()
        ref.weight.copy_(ours.weight)
    x = torch.randn(3, 5, 24, dtype=dtype) * 4
    check_close("RMSNorm", ours(x), ref(x), **TOL[dtype])


def test_rmsnorm_low_precision_computes_in_fp32():
    x = torch.randn(4, 64, dtype=torch.bfloat16) * 300  # squares overflow fp16 and lose bf16 precision
    norm = RMSNorm(64).to(torch.bfloat16)
    expected = torch.nn.functional.rms_norm(x.float(), (64,), eps=1e-6).to(torch.bfloat16)
    assert norm(x).dtype == torch.bfloat16
    assert torch.equal(norm(x), expected)


# silu vs F.silu: x * sigmoid(x) against torch's x / (1 + exp(-x)), the same derivative formula.
# Measured max differences (10,009 points, |x| up to 1e4): fp64 3.6e-15 values / 8.9e-16 grads,
# fp32 9.5e-7 / 4.8e-7 (1 ulp), bf16 and fp16 0 (both round an fp32 result once): tolerances
# are ~1 ulp of each dtype.
def test_config_presets_and_validation():
    g, l = GPTConfig.gpt2_style(d_model=32), GPTConfig.llama_style(n_layer=3)
    assert (g.norm, g.mlp, g.pos, g.tie_embeddings, g.bias) == ("layernorm", "gelu", "learned", True, True)
    assert (l.norm, l.mlp, l.pos, l.tie_embeddings, l.bias) == ("rmsnorm", "swiglu", "rope", False, False)
    assert g.ff_dim == 128 and l.n_layer == 3
    assert l.kv_heads < l.n_head
    with pytest.raises(ValueError):
        GPTConfig(norm="batchnorm")
    with pytest.raises(ValueError):
        GPTConfig(n_head=4, n_kv_head=3)
    model = GPT(GPTConfig.gpt2_style(max_seq_len=8))
    with pytest.raises(ValueError):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_device_helpers():
    assert pick_device("cpu") == torch.device("cpu")
    expected = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    assert pick_device() == expected
    if not torch.cuda.is_available():
        assert pick_device("cuda") == torch.device("cpu")  # silent fallback
    assert autocast_dtype("cpu") == torch.bfloat16
    seed_everything(123)
    a = torch.rand(3)
    seed_everything(123)
    assert torch.equal(a, torch.rand(3))


def test_import_camplib_is_light():
    # `import camplib` (and even the model) must not pull in transformers: notebooks import it first
    code = ("import sys, camplib; assert 'torch' not in sys.modules; camplib.model.GPT; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_model_knows_nothing_of_hf_or_generation():
    """camplib.hf and camplib.generate depend on the model, never the other way round."""
    import ast

    import camplib.model
    tree = ast.parse(open(camplib.model.__file__).read())
    used = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    used |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in used if m.split(".")[0] == "transformers" or m in ("camplib.hf", "camplib.generate")}, used
    assert not any(hasattr(GPT, name) for name in ("from_hf", "to_hf", "generate"))
