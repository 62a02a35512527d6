"""Memory accounting (camplib.memory) against measured storages, and activation checkpointing
(camplib.activation_checkpoint) against no checkpointing and torch.utils.checkpoint.

Tolerances: on the CPU, bytes are compared exactly; on CUDA, the caching allocator rounds every
block up to a multiple of 512 bytes, so each tensor may add up to 512. Checkpointed gradients in
fp32: atol=1e-6, rtol=1e-5 (the recomputation runs the same kernels; in practice they are equal).
"""
import pytest
import torch
import torch.utils.checkpoint
from torch import nn

from camplib.amp import MasterWeights
from camplib.activation_checkpoint import checkpoint, enable_checkpointing
from camplib.memory import (
    adam_memory_estimate,
    measure_memory,
    saved_activation_bytes,
    storage_bytes,
)
from camplib.model import GPT, GPTConfig, count_parameters
from tests.support import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GRAD_ATOL, GRAD_RTOL = 1e-6, 1e-5
CFG = dict(vocab_size=64, n_layer=3, n_head=2, d_model=32, max_seq_len=16)


def batch(cfg, B=2, T=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg["vocab_size"], (B, T + 1), generator=g).to(DEVICE)
    return ids[:, :-1], ids[:, 1:]


def grads_of(model, x, y, seed=0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # dropout masks
    _, loss = model(x, y)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def torch_checkpointed(model):
    """The same model with torch.utils.checkpoint (non-reentrant) around every block."""
    def wrap(block):
        def forward(x, cache=None, attn_mask=None, positions=None):
            return torch.utils.checkpoint.checkpoint(type(block).forward, block, x, use_reentrant=False,
                                                     attn_mask=attn_mask, positions=positions)
        return forward
    for block in model.blocks:
        block.forward = wrap(block)
    return model


@pytest.mark.parity
@pytest.mark.parametrize("cfg", [dict(CFG, dropout=0.1), dict(CFG, norm="rmsnorm", mlp="swiglu", pos="rope",
                                                                  tie_embeddings=False, bias=False)],
                         ids=["gpt2-dropout", "llama"])
def test_checkpointed_gradients_equal_plain_and_torch(cfg):
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**cfg)).to(DEVICE).train()
    ours = GPT(GPTConfig(**cfg)).to(DEVICE).train()
    theirs = GPT(GPTConfig(**cfg)).to(DEVICE).train()
    ours.load_state_dict(plain.state_dict())
    theirs.load_state_dict(plain.state_dict())
    enable_checkpointing(ours)
    torch_checkpointed(theirs)
    x, y = batch(cfg)
    expected = grads_of(plain, x, y)
    for name, model in [("camplib.activation_checkpoint", ours), ("torch.utils.checkpoint", theirs)]:
        got = grads_of(model, x, y)
        assert_close(f"{name} gradients", got, expected, atol=GRAD_ATOL, rtol=GRAD_RTOL)
    assert list(ours.state_dict()) == list(plain.state_dict())   # blocks unchanged, only forward wrapped
    enable_checkpointing(ours, enabled=False)
    assert all("forward" not in b.__dict__ for b in ours.blocks)


@pytest.mark.parity
def test_checkpoint_function_on_a_plain_function_with_several_inputs():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 5, generator=g, dtype=torch.float64), torch.randn(5, 3, generator=g, dtype=torch.float64)

    def fn(a, b, power):
        return torch.tanh(a @ b) ** power

    results = []
    for run in (lambda a, b: fn(a, b, 3), lambda a, b: checkpoint(fn, a, b, 3),
                lambda a, b: torch.utils.checkpoint.checkpoint(fn, a, b, 3, use_reentrant=False)):
        la, lb = a.clone().requires_grad_(), b.clone().requires_grad_()
        run(la, lb).sum().backward()
        results.append((la.grad, lb.grad))
    for name, got in zip(("camplib checkpoint", "torch.utils.checkpoint"), results[1:]):
        assert_close(f"{name} (a, b) grads", got, results[0], atol=1e-12, rtol=1e-10)


def test_checkpointing_saves_only_block_inputs():
    """Checkpointed, each block keeps exactly its input (B*T*d fp32) and nothing else, so the
    activations equal those of the same model without blocks plus n_layer block inputs."""
    cfg = dict(CFG)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**cfg)).to(DEVICE)
    x, y = batch(cfg)
    plain, out = saved_activation_bytes(model, x, y, exclude=model.parameters())
    del out
    enable_checkpointing(model)
    ckpt, out = saved_activation_bytes(model, x, y, exclude=model.parameters())
    del out
    no_blocks = GPT(GPTConfig(**dict(cfg, n_layer=0))).to(DEVICE)
    base, _ = saved_activation_bytes(no_blocks, x, y, exclude=no_blocks.parameters())
    B, T = x.shape
    assert ckpt == base + cfg["n_layer"] * B * T * cfg["d_model"] * 4
    assert ckpt < plain / 3, f"checkpointed {ckpt} vs plain {plain} bytes"


def test_activation_bytes_of_an_mlp_match_the_formula():
    """Linear(d, h) -> GELU -> Linear(h, d) on (B, d): GELU saves its input and the second Linear
    saves GELU's output, each B*h fp32; x and the weights existed before and are not counted."""
    B, d, h = 7, 12, 48
    mlp = nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, d)).to(DEVICE)
    x = torch.randn(B, d, device=DEVICE)
    saved, out = saved_activation_bytes(mlp, x, exclude=mlp.parameters())
    assert saved == 2 * B * h * 4
    with torch.no_grad():
        assert saved_activation_bytes(mlp, x, exclude=mlp.parameters())[0] == 0


def test_grad_inputs_records_a_function_without_parameters():
    """exp(x * y) records a graph only when its inputs need gradients; with grad_inputs=True they
    do (as copies, which count as inputs, not activations): mul saves x and y (inputs, not
    counted), exp saves its result, 5*3 fp32."""
    x, y = torch.randn(5, 3, device=DEVICE), torch.randn(5, 3, device=DEVICE)
    fn = lambda a, b: torch.exp(a * b)
    assert saved_activation_bytes(fn, x, y)[0] == 0
    saved, out = saved_activation_bytes(fn, x, y, grad_inputs=True)
    assert out.requires_grad and not x.requires_grad
    assert saved == 5 * 3 * 4, saved


def train_step(model, opt, cfg):
    x, y = batch(cfg)
    opt.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    opt.step()


@pytest.mark.parity
def test_adam_accounting_matches_storages_fp32():
    cfg = GPTConfig(**CFG)
    model = GPT(cfg).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_step(model, opt, CFG)
    params = list(model.parameters())
    psi = count_parameters(cfg)
    measured = measure_memory(model, opt)
    expected = adam_memory_estimate(psi, torch.float32, n_param_tensors=len(params))
    assert measured == expected, f"measured {measured}\nformula  {expected}"
    assert measured.params + measured.grads + measured.optimizer_state == 16 * psi + 4 * len(params)
    # the tied lm_head / tok_emb weight is one storage: counted once
    assert storage_bytes([model.lm_head.weight, model.tok_emb.weight]) == model.tok_emb.weight.numel() * 4


@pytest.mark.parity
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_adam_accounting_matches_storages_mixed_precision(dtype):
    cfg = GPTConfig(**CFG)
    model = GPT(cfg).to(DEVICE, dtype)
    opt = MasterWeights(model.parameters(), torch.optim.AdamW, lr=1e-3)
    train_step(model, opt, CFG)
    psi, n_tensors = count_parameters(cfg), len(list(model.parameters()))
    measured = measure_memory(model, opt)
    expected = adam_memory_estimate(psi, dtype, mixed_precision=True, n_param_tensors=n_tensors)
    assert measured == expected, f"measured {measured}\nformula  {expected}"
    assert measured.total == 16 * psi + 4 * n_tensors      # ZeRO's (2 + 2 + 12) Psi, plus Adam's step scalars


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: compares with the caching allocator")
def test_accounting_matches_cuda_allocations():
    """Deltas of torch.cuda.memory_allocated around building, backward and the first Adam step
    (Adam's `step` scalars live on the CPU: not counted on the GPU), and the peak during forward
    (max_memory_allocated) against the saved activations."""
    cfg = GPTConfig(**dict(CFG, d_model=64, n_layer=4, pos="rope"))
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    model = GPT(cfg).cuda()
    params = list(model.parameters())
    existing = params + list(model.buffers())
    slack = 512 * len(params)
    psi = count_parameters(cfg)
    buffers = storage_bytes(model.buffers())   # the RoPE tables
    assert abs(torch.cuda.memory_allocated() - start - 4 * psi - buffers) <= slack
    x, y = batch(CFG | {"vocab_size": cfg.vocab_size}, B=4)
    # One step first: cuBLAS takes its workspace from the caching allocator on its first matmul
    # (32 MiB on an H200, once per process and stream), which is neither activations nor grads.
    model(x.cuda(), y.cuda())[1].backward()
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    saved, (logits, loss) = saved_activation_bytes(model, x, y, exclude=existing)
    after_forward = torch.cuda.memory_allocated() - base
    outputs = logits.untyped_storage().nbytes() + loss.untyped_storage().nbytes()
    assert saved > 0
    assert saved <= after_forward <= saved + outputs + 512 * 200, (saved, after_forward, outputs)
    assert torch.cuda.max_memory_allocated() - base >= saved
    loss.backward()
    del logits, loss
    grads_allocated = torch.cuda.memory_allocated() - base
    assert abs(grads_allocated - 4 * psi) <= slack, (grads_allocated, 4 * psi)
    opt = torch.optim.AdamW(params, lr=1e-3)
    before_step = torch.cuda.memory_allocated()
    opt.step()
    state_allocated = torch.cuda.memory_allocated() - before_step
    assert abs(state_allocated - 8 * psi) <= 2 * slack, (state_allocated, 8 * psi)


def test_saved_activations_live_and_peak_follow_forwards_and_backwards():
    """Two forwards in flight hold both graphs' activations (the shared input once); each
    backward releases its own; the peak equals what saved_activation_bytes counts for the two."""
    from camplib.memory import SavedActivations, saved_activation_bytes, storage_key
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    x = torch.randn(8, 16)
    params = {storage_key(p) for p in mlp.parameters()}
    both, _ = saved_activation_bytes(lambda: (mlp(x).sum(), mlp(x).sum()), exclude=list(mlp.parameters()))
    one, _ = saved_activation_bytes(lambda: mlp(x).sum(), exclude=list(mlp.parameters()))
    with SavedActivations(lambda: params) as acts:
        first, second = mlp(x).sum(), mlp(x).sum()
        assert acts.live == acts.peak == both
        first.backward()
        assert acts.live == both - one + x.numel() * 4      # x stays saved by the second graph
        second.backward()
        assert acts.live == 0 and acts.peak == both
