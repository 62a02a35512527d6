"""camplib.parallel.tensor.run's runners for lab a03: handed camplib's own tensor-parallel pieces
they reproduce the dense computation, and handed the typical wrong ones they show what is wrong
(the collectives made, the largest tensor, a clear error for a badly shaped shard).

Tolerances: fp64 atol 1e-12, rtol 1e-10; fp32 atol 1e-5, rtol 1e-4 (the ranks sum partial matmuls in
another order than the dense block).
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from camplib.dist.launch import RankError
from camplib.model import GPTConfig
from camplib.parallel.tensor.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    vocab_parallel_cross_entropy,
)
from camplib.parallel.tensor.comm import _CopyToTP, _ReduceFromTP, gather_from_tp
from camplib.parallel.tensor.run import (
    conjugate_ops_on_ranks,
    dense_block,
    parallel_block_on_ranks,
    vocab_loss_on_ranks,
)
from tests.support import assert_close

TOL = {"float64": {"atol": 1e-12, "rtol": 1e-10}, "float32": {"atol": 1e-5, "rtol": 1e-4}}
BLOCKS = {"gpt2": GPTConfig.gpt2_style(n_head=4, d_model=32, max_seq_len=16),
          "llama": GPTConfig.llama_style(n_head=8, n_kv_head=4, d_model=32, max_seq_len=16)}


# -- f and g -------------------------------------------------------------------------------------------
class CopyToTP(torch.autograd.Function):
    """camplib's f on the default group, in the lab's signature."""
    @staticmethod
    def forward(ctx, x):
        return _CopyToTP.forward(ctx, x, None)

    @staticmethod
    def backward(ctx, grad):
        return _CopyToTP.backward(ctx, grad)[0]


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _ReduceFromTP.forward(ctx, x, None)

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReduceBothWays(ReduceFromTP):
    """A g that also all-reduces in backward (what a differentiable all-reduce does): t-fold gradients."""
    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def test_conjugate_ops_runner_reports_values_gradients_and_collectives():
    g = torch.Generator().manual_seed(0)
    xs, dys = ([torch.randn(3, 4, generator=g, dtype=torch.float64) for _ in range(2)] for _ in range(2))
    out = conjugate_ops_on_ranks(CopyToTP, ReduceBothWays, 2, xs, dys)
    for rank in range(2):
        assert_close(f"f output rank {rank}", out["f"]["y"][rank], xs[rank], **TOL["float64"])
        assert_close(f"f input grad rank {rank}", out["f"]["x_grad"][rank], dys[0] + dys[1], **TOL["float64"])
        assert_close(f"g output rank {rank}", out["g"]["y"][rank], xs[0] + xs[1], **TOL["float64"])
        assert out["f"]["calls_forward"][rank] == {} and out["f"]["calls_backward"][rank] == {"allreduce": 1}
        assert out["g"]["calls_forward"][rank] == {"allreduce": 1}
        # the wrong g shows twice over: gradients summed over the ranks, and an all-reduce in backward
        assert_close(f"wrong g input grad rank {rank}", out["g"]["x_grad"][rank], dys[0] + dys[1], **TOL["float64"])
        assert out["g"]["calls_backward"][rank] == {"allreduce": 1}
    with pytest.raises(ValueError, match="one input and one gradient per rank: 2 and 2 for t=3"):
        conjugate_ops_on_ranks(CopyToTP, ReduceFromTP, 3, xs, dys)


# -- column and row layers inside a dense block --------------------------------------------------------
@pytest.mark.parity
@pytest.mark.parametrize("style, dtype", [("gpt2", "float64"), ("llama", "float32")])
def test_camplibs_layers_put_into_a_dense_block_compute_the_dense_block(style, dtype):
    config = vars(BLOCKS[style])
    block = dense_block(config, seed=3, dtype=dtype)
    g = torch.Generator().manual_seed(4)
    x, dy = (torch.randn(2, 8, 32, generator=g, dtype=block.ln1.weight.dtype) for _ in range(2))
    xr = x.clone().requires_grad_(True)
    y = block(xr)
    y.backward(dy)
    out = parallel_block_on_ranks(ColumnParallelLinear, RowParallelLinear, 2, config, dict(block.state_dict()), x, dy,
                                  dtype)
    tol = TOL[dtype]
    for rank in range(2):
        assert out["missing"][rank] == [], out["missing"]
        assert_close(f"{style} output rank {rank}", out["y"][rank], y.detach(), **tol)
        assert_close(f"{style} input grad rank {rank}", out["x_grad"][rank], xr.grad, **tol)
        for name, grad in out["replicated_grads"][rank].items():
            assert_close(f"{style} {name} grad rank {rank}", grad, dict(block.named_parameters())[name].grad, **tol)
        # GELU MLP: f before fc and before qkv; SwiGLU: camplib's gate and up each pass their own f here
        assert out["calls_forward"][rank] == {"allreduce": 2}
        assert out["calls_backward"][rank] == {"allreduce": 2 if style == "gpt2" else 3}
    assert_close(f"{style} gradients (shards joined)", out["grads"], {n: p.grad for n, p in block.named_parameters()},
                 **tol)


class WholeColumn(nn.Linear):
    """A 'column layer' that keeps the whole weight: the runner must refuse it by shape."""
    def __init__(self, in_features, out_features, bias=True):
        super().__init__(in_features, out_features, bias=bias)


def test_a_shard_of_the_wrong_shape_is_refused_naming_both_shapes():
    config = vars(BLOCKS["gpt2"])
    x = torch.zeros(1, 2, 32)
    with pytest.raises(RankError, match=r"WholeColumn\(32, 96\)\.weight has shape \(96, 32\) on rank \d of 2, "
                                        r"expected \(48, 32\)"):
        parallel_block_on_ranks(WholeColumn, RowParallelLinear, 2, config, dict(dense_block(config).state_dict()),
                                x, x, timeout=20)


# -- the vocab-parallel loss ---------------------------------------------------------------------------
def gathered_loss(local, targets, vocab_start):
    """Right numbers the wrong way: the full logits on every rank."""
    return F.cross_entropy(gather_from_tp(local), targets)


def test_vocab_loss_runner_measures_collectives_and_the_largest_tensor():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(12, 20, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(0, 20, (12,), generator=g)
    full = logits.clone().requires_grad_(True)
    loss = F.cross_entropy(full, targets)
    loss.backward()
    full_bytes = logits.numel() * 8
    for fn in (vocab_parallel_cross_entropy, gathered_loss):   # camplib's has lab a03's signature
        out = vocab_loss_on_ranks(fn, 2, logits, targets)
        assert_close(f"{fn.__name__} logits grad", out["logits_grad"], full.grad, **TOL["float64"])
        for rank in range(2):
            assert_close(f"{fn.__name__} loss rank {rank}", out["loss"][rank], loss.detach(), **TOL["float64"])
            assert out["local_logits_bytes"][rank] == full_bytes // 2
            if fn is vocab_parallel_cross_entropy:
                assert out["calls_forward"][rank] == {"allreduce": 3} and out["calls_backward"][rank] == {}
                assert out["largest_bytes"][rank] <= full_bytes // 2, out["largest_bytes"]
            else:
                assert out["calls_forward"][rank] == {"allgather": 1}
                assert out["largest_bytes"][rank] >= full_bytes, out["largest_bytes"]


# -- next to torch's own tensor parallelism, on a whole block -------------------------------------
def _ours_and_torchs_block_rank(rank, t, cases):
    from torch.distributed.device_mesh import init_device_mesh

    from camplib.model import Block
    from camplib.parallel.tensor.run import (
        block_rope,
        parallelize_block,
        torch_parallelize_block,
    )
    mesh = init_device_mesh("cpu", (t,))
    out = {}
    for style, (config, state, x, dy) in cases.items():
        for name in ("ours", "torch"):
            block = Block(GPTConfig(**config), block_rope(config)).double()
            block.load_state_dict(state)
            if name == "ours":
                parallelize_block(block, ColumnParallelLinear, RowParallelLinear, rank, t)
            else:
                torch_parallelize_block(block, mesh)
            xi = x.clone().requires_grad_(True)
            y = block(xi)
            (y * dy).sum().backward()
            out[f"{style} {name}"] = {"y": y.detach(), "x_grad": xi.grad}
    return out


@pytest.mark.slow    # ~6 s: importing torch._dynamo, which DTensor needs, is most of it
@pytest.mark.parity
def test_parallelize_block_equals_torchs_colwise_rowwise_plan_on_a_whole_block():
    """GPT-2 and Llama (GQA, RoPE, SwiGLU) blocks, fp64, 2 ranks: ours, torch's and the dense block agree."""
    import torch._dynamo  # DTensor imports it: once here, inherited by the forked ranks
    import torch.distributed.tensor.parallel

    from camplib.dist import launch
    cases, dense = {}, {}
    for style in ("gpt2", "llama"):
        config = vars(BLOCKS[style])
        block = dense_block(config, seed=6, dtype="float64")
        g = torch.Generator().manual_seed(7)
        x, dy = (torch.randn(2, 8, 32, generator=g, dtype=torch.float64) for _ in range(2))
        xr = x.clone().requires_grad_(True)
        y = block(xr)
        (y * dy).sum().backward()
        cases[style], dense[style] = (config, dict(block.state_dict()), x, dy), (y.detach(), xr.grad)
    for rank, res in enumerate(launch(_ours_and_torchs_block_rank, 2, cases, backend="gloo", timeout=60)):
        for key, got in res.items():
            y, x_grad = dense[key.split()[0]]
            assert_close(f"{key} output rank {rank}", got["y"], y, **TOL["float64"])
            assert_close(f"{key} input grad rank {rank}", got["x_grad"], x_grad, **TOL["float64"])


def test_splits_that_cannot_work_are_refused_before_any_rank_starts():
    config = vars(BLOCKS["gpt2"])  # 4 heads
    x = torch.zeros(1, 2, 32)
    with pytest.raises(ValueError, match="n_head=4 is not divisible by the tensor-parallel size t=3"):
        parallel_block_on_ranks(ColumnParallelLinear, RowParallelLinear, 3, config, {}, x, x)
    with pytest.raises(ValueError, match="vocab_size=5 is not divisible by the tensor-parallel size t=2"):
        vocab_loss_on_ranks(vocab_parallel_cross_entropy, 2, torch.zeros(3, 5), torch.zeros(3, dtype=torch.long))
