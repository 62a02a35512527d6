"""camplib.parallel.tensor.layers: camplib's GPT split over 2 and 4 gloo ranks computes the dense model's
logits, loss and every gradient; each block costs 2 all-reduces forward and 2 backward (sequence
parallel: all-gather / reduce-scatter pairs moving the same bytes); the loss never builds the full
logits; the MLP matches torch.distributed.tensor.parallel; bad splits fail before communicating.

Tolerances: fp64 atol 1e-12, rtol 1e-10; fp32 atol 1e-6, rtol 1e-5 (the ranks sum partial matmuls in
a different order than the dense model: measured at most 5e-16 (fp64) and 5e-7 (fp32, the loss of
~3.9) on these models, a few ulps).
"""
import pytest
import torch
import torch.distributed as dist

from camplib.dist import launch
from camplib.dist.counting import count_bytes
from camplib.model import MLP, GPTConfig, SwiGLU
from camplib.parallel.model_specs import build_model
from camplib.parallel.tensor.layers import (
    ColumnParallelLinear,
    ParallelAttention,
    ParallelMLP,
    Shard,
    largest_new_tensor,
    shard_of,
    split_evenly,
    unshard,
    vocab_parallel_cross_entropy,
)
from camplib.parallel.tensor.model import TensorParallelBlock, TensorParallelGPT, check_tp_config, shard_layout
from camplib.parallel.tensor.run import dense_block, run_split_gpt
from tests.support import assert_close

TOL = {"float64": {"atol": 1e-12, "rtol": 1e-10}, "float32": {"atol": 1e-6, "rtol": 1e-5}}
TIMEOUT = 60
# vocab 51 divides by neither 2 nor 4: the padded vocabulary is exercised at both sizes
SMALL = {"vocab_size": 51, "n_layer": 2, "d_model": 32, "max_seq_len": 16}
STYLES = {"gpt2": GPTConfig.gpt2_style(n_head=4, **SMALL),
          "llama": GPTConfig.llama_style(n_head=8, n_kv_head=4, **SMALL)}  # GQA: 2 query heads per kv head
# (style, dtype, sequence parallel): each style and each dtype once with TP, once with SP
CASES = [("gpt2", "float64", False), ("llama", "float64", True), ("gpt2", "float32", True),
         ("llama", "float32", False)]


@pytest.fixture(scope="module")
def imported_once():
    """Ranks are forked, so they inherit this process's imports: torch's tensor parallelism and the
    torch._dynamo that entering a dispatch mode imports take seconds, once here, not once per rank."""
    import torch._dynamo
    import torch.distributed.tensor.parallel  # noqa: F401


def _spec(style: str, dtype: str) -> dict:
    return {"kind": "gpt", "config": vars(STYLES[style]), "dtype": dtype, "seed": 5}


def _dense(style: str, dtype: str):
    """The dense GPT, its biases and norm weights moved off GPT-2's zeros and ones (a bias added
    on every rank before the sum, rather than once after it, must show)."""
    model = build_model(_spec(style, dtype))
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _batch(seed: int, batch: int = 2, seq: int = 8):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, SMALL["vocab_size"], (batch, seq), generator=g)
    targets = torch.randint(0, SMALL["vocab_size"], (batch, seq), generator=g)
    targets[0, :3] = -100  # ignored positions
    return idx, targets


# -- the split model equals the dense one ----------------------------------------------------------
@pytest.mark.parity
@pytest.mark.parametrize("t", [2, 4])
def test_split_gpt_equals_dense_logits_loss_and_every_gradient(t):
    idx, targets = _batch(seed=t)
    cases = [{"model": _dense(style, dtype), "sequence_parallel": sp} for style, dtype, sp in CASES]
    results = run_split_gpt(t, cases, idx, targets, timeout=TIMEOUT)
    for (style, dtype, sp), res in zip(CASES, results):
        case, tol = f"{style} {dtype} t={t} {'SP' if sp else 'TP'}", TOL[dtype]
        dense = _dense(style, dtype)
        logits, loss = dense(idx, targets)
        loss.backward()
        grads = {n: p.grad for n, p in dense.named_parameters()}
        assert sorted(res["layout"]) == sorted(grads), f"{case}: parameter names differ from the dense model's"
        for rank in range(t):
            assert_close(f"{case} rank {rank} logits", res["logits"][rank], logits.detach(), **tol)
            assert_close(f"{case} rank {rank} loss", res["loss"][rank], loss.detach(), **tol)
            for name, grad in res["replicated"][rank].items():  # every rank holds the full gradient
                assert_close(f"{case} rank {rank} grad {name}", grad, grads[name], **tol)
        assert_close(f"{case} grads (ranks' shards joined)", res["grads"], grads, **tol)
        assert any(s.dim == 0 and s.dense_size for s in res["layout"].values()), f"{case}: vocab was not padded"


# -- what each block communicates ----------------------------------------------------------------
def _block_and_loss_counts_rank(rank, t):
    torch.manual_seed(0)
    cfg = STYLES["gpt2"]
    B, T, d = 2, 8, cfg.d_model
    out = {}
    for sp in (False, True):
        model = TensorParallelGPT(cfg, sequence_parallel=sp)
        x = torch.randn(B, T, d)
        x = x.chunk(t, dim=1)[rank].clone() if sp else x
        x.requires_grad_(True)
        with count_bytes() as fwd:
            y = model.blocks[0](x)
        with count_bytes() as bwd:
            y.sum().backward()
        out["SP" if sp else "TP"] = {"forward": (dict(fwd.calls), dict(fwd.payload)),
                                     "backward": (dict(bwd.calls), dict(bwd.payload))}
    # the loss alone: its collectives and the largest tensor it makes, vs the full logits
    N, V = B * T, cfg.vocab_size
    local = (torch.randn(N, model.tok_emb.local_vocab) * 3).requires_grad_(True)
    targets = torch.randint(0, V, (N,))
    with count_bytes() as ce_calls, largest_new_tensor() as biggest:
        loss = vocab_parallel_cross_entropy(local, targets, model.tok_emb.vocab_start, V)
        loss.backward()
    out["loss"] = {"calls": dict(ce_calls.calls), "largest": biggest.largest, "op": biggest.op, "ops": biggest.ops,
                   "local_logits": local.numel() * local.element_size(), "full_logits": N * V * local.element_size()}
    return out


def test_each_block_costs_two_all_reduces_each_way_and_sp_moves_the_same_bytes(imported_once):
    t, B, T, d = 2, 2, 8, STYLES["gpt2"].d_model
    res = launch(_block_and_loss_counts_rank, t, backend="gloo", timeout=TIMEOUT)[0]
    act = B * T * d * 4  # one fp32 activation (B, T, d)
    for way in ("forward", "backward"):
        calls, payload = res["TP"][way]
        assert calls == {"allreduce": 2}, f"TP {way}: {calls}, expected 2 all-reduces"
        assert payload == {"allreduce": 2 * act}, f"TP {way}: payload {payload}"
        calls, payload = res["SP"][way]
        assert calls == {"allgather": 2, "reduce_scatter": 2}, f"SP {way}: {calls}"
        # an all-gather's payload is its full output, a reduce-scatter's its 1/t output shard: both
        # move (t-1)/t of the same full activation, together what one all-reduce of it moves
        assert payload["allgather"] == payload["reduce_scatter"] * t == res["TP"][way][1]["allreduce"], \
            f"SP {way}: payload {payload} vs TP {res['TP'][way][1]}"
    ce = res["loss"]
    assert ce["calls"] == {"allreduce": 3}, f"vocab-parallel cross-entropy: {ce['calls']}, expected 3 all-reduces"
    assert ce["largest"] <= ce["local_logits"] < ce["full_logits"], \
        f"largest tensor {ce['largest']} B ({ce['op']}), local logits {ce['local_logits']} B, full {ce['full_logits']} B"
    assert "aten.exp_.default" in ce["ops"] and "aten.index_put_.default" in ce["ops"], \
        f"the measurement missed the loss's forward or backward: {ce['ops']}"


# -- next to torch's own tensor parallelism ---------------------------------------------------------
def _torch_tp_mlp_rank(rank, t, x):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    mesh = init_device_mesh("cpu", (t,))
    out = {}
    for kind, plan in [("gelu", {"fc": ColwiseParallel(), "proj": RowwiseParallel()}),
                       ("swiglu", {"gate": ColwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()})]:
        cfg = GPTConfig.gpt2_style(mlp=kind, d_model=16)
        torch.manual_seed(3)
        dense = (SwiGLU(cfg) if kind == "swiglu" else MLP(cfg)).double()
        ours = ParallelMLP(cfg.d_model, cfg.ff_dim, kind, bias=True).double()
        specs = shard_layout(ours)
        ours.load_state_dict({n: shard_of(p.detach(), specs[n], rank, t) for n, p in dense.named_parameters()})
        theirs = parallelize_module(dense, mesh, plan)
        out[kind] = {name: _forward_backward(module, x) for name, module in (("ours", ours), ("torch", theirs))}
    # a lone column layer that gathers its output vs ColwiseParallel with a replicated output
    torch.manual_seed(4)
    dense = torch.nn.Linear(16, 12).double()
    ours = ColumnParallelLinear(16, 12, gather_output=True).double()
    ours.load_state_dict({n: shard_of(p.detach(), ours.shard_specs()[n], rank, t) for n, p in dense.named_parameters()})
    theirs = parallelize_module(dense, mesh, ColwiseParallel(output_layouts=Replicate()))
    out["column, gathered"] = {name: _forward_backward(module, x) for name, module in (("ours", ours), ("torch", theirs))}
    return out


def _forward_backward(module, x) -> dict:
    xi = x.clone().requires_grad_(True)
    y = module(xi)
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    grads = {n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad) for n, p in module.named_parameters()}
    return {"y": y.detach(), "x.grad": xi.grad, "grads": grads}


@pytest.mark.parity
def test_parallel_mlp_and_gathered_column_equal_torch_colwise_rowwise_parallel(imported_once):
    x = torch.randn(2, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ranks = launch(_torch_tp_mlp_rank, 2, x, backend="gloo", timeout=TIMEOUT)
    for rank, res in enumerate(ranks):
        for kind, got in res.items():
            ours, theirs = got["ours"], got["torch"]
            assert sorted(ours["grads"]) == sorted(theirs["grads"]), f"{kind}: parameter names differ"
            assert_close(f"{kind} rank {rank} output", ours["y"], theirs["y"], **TOL["float64"])
            assert_close(f"{kind} rank {rank} input grad", ours["x.grad"], theirs["x.grad"], **TOL["float64"])
            assert_close(f"{kind} rank {rank} local grads", ours["grads"], theirs["grads"], **TOL["float64"])


# -- bad splits -------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg, t, words", [
    (GPTConfig.gpt2_style(n_head=3, d_model=24), 2, ["n_head=3", "t=2"]),
    (GPTConfig.gpt2_style(n_head=2, d_model=16), 4, ["n_head=2", "t=4", "larger"]),
    (GPTConfig.llama_style(n_head=4, n_kv_head=2, d_model=32), 4, ["n_kv_head=2", "t=4"]),
])
def test_bad_head_split_names_the_numbers(cfg, t, words):
    with pytest.raises(ValueError) as err:
        check_tp_config(cfg, t)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_vocab_not_divisible_is_padded_or_refused():
    cfg = GPTConfig.gpt2_style(vocab_size=51)
    check_tp_config(cfg, 2)  # padded to 52
    with pytest.raises(ValueError, match=r"vocab_size=51 is not divisible by the tensor-parallel size t=2"):
        check_tp_config(cfg, 2, pad_vocab=False)
    with pytest.raises(ValueError, match="sequence length=6 .* t=4"):
        check_tp_config(GPTConfig.gpt2_style(n_head=4), 4, sequence_parallel=True, seq_len=6)
    assert split_evenly(8, 4, "x") == 2


def test_shards_join_back_into_the_dense_tensor():
    dense = torch.arange(5 * 3.0).view(5, 3)  # 5 rows padded to 6 over t=3... fused parts below
    spec = Shard(0, (6,), 5)
    pieces = [shard_of(dense, spec, r, 3) for r in range(3)]
    assert [p.shape[0] for p in pieces] == [2, 2, 2] and pieces[2][1].abs().sum() == 0  # padding row
    assert torch.equal(unshard(pieces, spec), dense)
    qkv = torch.arange(8 * 2.0).view(8, 2)  # q: 4 rows, k: 2, v: 2 -> each rank gets 2 + 1 + 1
    spec = Shard(0, (4, 2, 2))
    assert shard_of(qkv, spec, 1, 2)[:, 0].tolist() == [4.0, 6.0, 10.0, 14.0]
    assert torch.equal(unshard([shard_of(qkv, spec, r, 2) for r in range(2)], spec), qkv)


def _bad_layers_rank(rank, t):
    errors = []
    with count_bytes() as c:
        for build in (lambda: ParallelAttention(24, 3),                                  # heads 3 on 2 ranks
                      lambda: ParallelAttention(32, 4, 1),                               # 1 kv head on 2 ranks
                      lambda: TensorParallelGPT(GPTConfig.gpt2_style(vocab_size=51), pad_vocab=False)):
            try:
                build()
                errors.append(None)
            except ValueError as exc:
                errors.append(str(exc))
        try:  # a sequence that does not split: refused before the embedding's reduce-scatter
            TensorParallelGPT(STYLES["gpt2"], sequence_parallel=True)(torch.zeros(1, 5, dtype=torch.long))
        except ValueError as exc:
            errors.append(str(exc))
    return {"errors": errors, "calls": dict(c.calls), "initialized": dist.is_initialized()}


def test_bad_layers_raise_on_every_rank_before_any_collective():
    for rank, res in enumerate(launch(_bad_layers_rank, 2, backend="gloo", timeout=TIMEOUT)):
        assert res["initialized"] and res["calls"] == {}, f"rank {rank} communicated: {res['calls']}"
        expected = [["n_heads=3", "t=2"], ["n_kv_heads=1", "t=2"], ["vocab_size=51", "t=2"],
                    ["sequence length=5", "t=2"]]
        assert len(res["errors"]) == len(expected), res["errors"]
        for message, words in zip(res["errors"], expected):
            assert message is not None and all(w in message for w in words), f"rank {rank}: {message!r}, expected {words}"


# -- a trained dense block, sharded ----------------------------------------------------------------
BLOCK_CASES = {"gpt2 TP": ("gpt2", False), "gpt2 SP": ("gpt2", True), "llama (GQA) TP": ("llama", False),
               "llama (GQA) SP": ("llama", True)}


def _block_from_dense_rank(rank, t, x, dy):
    out = {}
    for case, (style, sp) in BLOCK_CASES.items():
        dense = dense_block(vars(STYLES[style]), seed=2, dtype="float64")
        block = TensorParallelBlock.from_dense(dense, sequence_parallel=sp)
        xi = (x.chunk(t, dim=1)[rank] if sp else x).clone().requires_grad_(True)
        y = block(xi)
        (y * (dy.chunk(t, dim=1)[rank] if sp else dy)).sum().backward()
        synced = 0
        if sp:
            from camplib.parallel.tensor.layers import sync_sequence_parallel_grads
            synced = sync_sequence_parallel_grads(block)
        out[case] = {"y": y.detach(), "x_grad": xi.grad, "grads": {n: p.grad for n, p in block.named_parameters()},
                     "layout": shard_layout(block), "synced": synced,
                     "marked": sum(getattr(p, "sequence_parallel", False) for p in block.parameters())}
    return out


@pytest.mark.parity
def test_block_from_dense_gives_the_dense_outputs_and_gradients(imported_once):
    """TensorParallelBlock.from_dense(trained Block) on 2 gloo ranks: the block's output, the input's
    gradient and every parameter's gradient (shards joined) equal the dense block's, plain TP and
    with sequence parallelism (inputs and outputs as sequence shards), GPT-2 and Llama (GQA, RoPE)
    blocks, fp64 atol 1e-12, rtol 1e-10. (~3 s)"""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 8, SMALL["d_model"], generator=g, dtype=torch.float64)
    dy = torch.randn(2, 8, SMALL["d_model"], generator=g, dtype=torch.float64)
    ranks = launch(_block_from_dense_rank, 2, x, dy, backend="gloo", timeout=TIMEOUT)
    for case, (style, sp) in BLOCK_CASES.items():
        dense = dense_block(vars(STYLES[style]), seed=2, dtype="float64")
        xd = x.clone().requires_grad_(True)
        y = dense(xd)
        (y * dy).sum().backward()
        grads = {n: p.grad for n, p in dense.named_parameters()}
        per_rank = [r[case] for r in ranks]
        layout = per_rank[0]["layout"]
        assert sorted(layout) == sorted(grads), f"{case}: parameter names differ from the dense block's"
        assert any(spec.dim is not None for spec in layout.values()), f"{case}: nothing was split"
        if sp:
            # norms (+ row biases for GPT-2): 6 or 2 parameters, each with a gradient to sum
            assert per_rank[0]["synced"] == per_rank[0]["marked"] == (6 if style == "gpt2" else 2), \
                f"{case}: {per_rank[0]['synced']} of {per_rank[0]['marked']} sequence-parallel gradients summed"
            assert_close(f"{case} output (sequence shards joined)", torch.cat([r["y"] for r in per_rank], 1), y.detach(),
                         **TOL["float64"])
            assert_close(f"{case} input grad (shards joined)", torch.cat([r["x_grad"] for r in per_rank], 1), xd.grad,
                         **TOL["float64"])
        else:
            for rank, r in enumerate(per_rank):
                assert_close(f"{case} rank {rank} output", r["y"], y.detach(), **TOL["float64"])
                assert_close(f"{case} rank {rank} input grad", r["x_grad"], xd.grad, **TOL["float64"])
        for name, spec in layout.items():
            pieces = [r["grads"][name] for r in per_rank]
            if spec.dim is None:
                for rank, piece in enumerate(pieces):
                    assert_close(f"{case} rank {rank} grad {name} (held whole)", piece, grads[name], **TOL["float64"])
            else:
                assert_close(f"{case} grad {name} (shards joined)", unshard(pieces, spec), grads[name], **TOL["float64"])


def _forgotten_sync_rank(rank, t):
    from camplib.optim import AdamW
    from camplib.parallel.tensor.layers import sync_sequence_parallel_grads
    torch.manual_seed(0)
    idx = torch.randint(0, SMALL["vocab_size"], (2, 8))
    out = {}
    for name, optimizer in (("torch AdamW", torch.optim.AdamW), ("camplib AdamW", AdamW), ("SGD", torch.optim.SGD)):
        model = TensorParallelGPT(STYLES["gpt2"], sequence_parallel=True)
        opt = optimizer(model.parameters(), lr=1e-2)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        model(idx, idx)[1].backward()
        try:
            opt.step()
            out[name] = {"error": None}
        except RuntimeError as exc:
            out[name] = {"error": str(exc)}
        out[name]["unchanged"] = all(torch.equal(before[n], p) for n, p in model.named_parameters())
        # the right loop, with gradient accumulation: two backwards, one sum, one step
        opt.zero_grad()
        for _ in range(2):
            model(idx, idx)[1].backward()
        out[name]["summed"] = model.sync_grads()
        opt.step()
        model(idx, idx)[1].backward()
        sync_sequence_parallel_grads(model)          # the function works as well as the method
        opt.step()
        out[name]["moved"] = not all(torch.equal(before[n], p) for n, p in model.named_parameters())
    return out


def test_forgetting_sync_grads_with_sequence_parallelism_is_a_clear_error(imported_once):
    """Without model.sync_grads() after backward, the norms' (and the position table's) gradients hold
    one rank's tokens only, and a step would train each rank differently, silently: a torch
    optimizer's step() (torch's AdamW and SGD, camplib's AdamW) raises before changing anything, and
    names the fix. After the sum (once per step, after accumulating two micro-batches) it steps. (~3 s)"""
    for rank, res in enumerate(launch(_forgotten_sync_rank, 2, backend="gloo", timeout=TIMEOUT)):
        for name, got in res.items():
            assert got["error"] is not None, f"rank {rank}, {name}: step() without sync_grads() did not raise"
            assert "sync_grads()" in got["error"] and "sequence" in got["error"], got["error"]
            assert got["unchanged"], f"rank {rank}, {name}: the refused step changed parameters"
            assert got["summed"] > 0 and got["moved"], (rank, name, got)
