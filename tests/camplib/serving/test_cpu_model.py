"""The serving engine's step: one forward per step (prefills and decodes together), and the
model as it runs on a CPU (oneDNN-packed linears, fused gate/up, one-call RMSNorm) computing the
same function up to rounding."""
import torch
import torch.nn.functional as F

import camplib.serving.engine as engine_module
from camplib.generate import generate
from camplib.model import GPT, GPTConfig
from camplib.serving import Engine, SamplingParams
from camplib.serving.cpu_model import OneCallRMSNorm, PackedLinear, PackedSwiGLU, available, for_cpu_serving
from tests.support import not_run


def _model():
    torch.manual_seed(0)
    model = GPT(GPTConfig.llama_style(vocab_size=64, max_seq_len=64, n_layer=2, d_model=32, n_head=4)).eval()
    with torch.no_grad():   # weights larger than the init: peaked logits, no near-ties for greedy
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model


def _need_onednn():
    if not available("cpu", torch.float32):
        not_run("fast CPU serving model NOT RUN: this torch build has no torch.ops.mkldnn._reorder_linear_weight")


def test_packed_linear_equals_f_linear_and_leaves_the_model_alone():
    _need_onednn()
    torch.manual_seed(1)
    for rows in (1, 16, 37):
        lin = torch.nn.Linear(96, 200, bias=rows == 16)
        x = torch.randn(rows, 96)
        with torch.no_grad():
            got, want = PackedLinear(lin)(x), F.linear(x, lin.weight, lin.bias)
        err = ((got - want).abs().max() / want.abs().max()).item()
        assert err < 1e-5, f"{rows} rows: packed vs F.linear max difference {err:.2e} of the largest output (tolerance 1e-5)"
    model = _model()
    served = for_cpu_serving(model)
    assert isinstance(served.blocks[0].attn.qkv, PackedLinear) and isinstance(served.lm_head, PackedLinear)
    assert isinstance(served.blocks[0].mlp, PackedSwiGLU) and isinstance(served.blocks[0].ln1, OneCallRMSNorm)
    assert type(model.blocks[0].attn.qkv) is torch.nn.Linear, "the caller's model must keep its own layers"
    assert served.blocks[1].mlp.down.weight is model.blocks[1].mlp.down.weight, "parameters are shared, not copied"
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        norm_diff = (served.blocks[0].ln1(x) - model.blocks[0].ln1(x)).abs().max().item()
        mlp_diff = ((served.blocks[0].mlp(x) - model.blocks[0].mlp(x)).abs().max() / model.blocks[0].mlp(x).abs().max()).item()
        ids = torch.randint(0, 64, (2, 9))
        logits_diff = (served(ids)[0] - model(ids)[0]).abs().max().item()
    assert norm_diff < 1e-6, f"one-call RMSNorm vs camplib's: max difference {norm_diff:.2e} (tolerance 1e-6)"
    assert mlp_diff < 1e-5, f"fused SwiGLU vs camplib's: max difference {mlp_diff:.2e} of the largest output (tolerance 1e-5)"
    assert logits_diff < 1e-4, f"whole model, logits: max difference {logits_diff:.2e} (tolerance 1e-4)"


def test_one_forward_per_step_and_packed_engine_matches_generate(monkeypatch):
    _need_onednn()
    calls = []
    forward = engine_module.paged_forward
    monkeypatch.setattr(engine_module, "paged_forward", lambda *a: calls.append(a[2]) or forward(*a))
    model = _model()
    engine = Engine(model, block_size=4, num_blocks=64, max_batch=4, fast_cpu=True)
    assert engine.fast_cpu
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (7, 3, 12)]
    first = engine.add(prompts[0], SamplingParams(max_tokens=10))
    engine.step()
    engine.step()
    late = [engine.add(p, SamplingParams(max_tokens=10)) for p in prompts[1:]]   # join while the first decodes
    while engine.has_work():
        engine.step()
    assert len(calls) == engine.steps, f"{len(calls)} forwards in {engine.steps} steps: one per step"
    mixed = calls[2]
    lens = [c.length for c in mixed.chunks]
    assert (mixed.n_decode, lens) == (1, [3, 12]), \
        f"step 3 should decode the first request and prefill both late ones: got {mixed.n_decode}, {lens}"
    for seq, p in zip([first, *late], prompts):
        alone = generate(model, torch.tensor([p]), 10)[0, len(p):].tolist()
        assert seq.output == alone, f"prompt of {len(p)} tokens: packed engine {seq.output} != generate {alone}"
