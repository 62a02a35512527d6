"""Tensor parallelism side by side on the same ranks in one run (gloo on CPU): one GPT block's
forward + backward dense (the whole block on every rank, what one process computes), split by
camplib (`parallelize_block` with camplib.parallel.tensor.layers's column / row layers) and split by
torch (`torch_parallelize_block`: ColwiseParallel / RowwiseParallel on a DeviceMesh).

Printed: median step time of each and the ratios (ours / dense: what t ranks gain on the
compute, or lose to communication, at this size; ours / torch: the cost of our layers against
torch's DTensor machinery), the collectives camplib's split makes per step and the bytes handed to
them (torch's go through c10d's functional ops, which camplib.dist.counting does not see), and the largest difference of the outputs from the dense block's (they must agree).
Blocks of steps alternate between the three so that noise from other processes hits all alike.

    .venv/bin/python benchmarks/tensor_parallel_speed.py [--ranks 2] [--d-model 256] [--seq 128]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from camplib.dist import launch
from camplib.dist.counting import count_bytes
from camplib.model import Block, GPTConfig
from camplib.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear
from camplib.parallel.tensor.run import (
    block_rope,
    dense_block,
    parallelize_block,
    torch_parallelize_block,
)


def _step(block, x, dy) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    xi = x.clone().requires_grad_(True)
    y = block(xi)
    (y * dy).sum().backward()
    return time.perf_counter() - start, y.detach()


def _rank(rank, t, config, state, x, dy, rounds, steps, threads):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    torch.set_num_threads(threads)
    blocks = {}
    for name in ("dense", "camplib", "torch"):
        block = Block(GPTConfig(**config), block_rope(config))
        block.load_state_dict(state)
        if name == "camplib":
            parallelize_block(block, ColumnParallelLinear, RowParallelLinear, rank, t)
        elif name == "torch":
            torch_parallelize_block(block, init_device_mesh("cpu", (t,)))
        blocks[name] = block
    out = {"times": {n: [] for n in blocks}, "calls": {}, "payload": {}, "y": {}}
    for name, block in blocks.items():   # warm-up, and one counted step
        _step(block, x, dy)
        with count_bytes() as c:
            _, out["y"][name] = _step(block, x, dy)
        out["calls"][name], out["payload"][name] = dict(c.calls), sum(c.payload.values())
    for r in range(rounds):
        for name in (list(blocks) if r % 2 == 0 else list(blocks)[::-1]):
            dist.barrier()
            out["times"][name] += [_step(blocks[name], x, dy)[0] for _ in range(steps)]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args()
    import torch._dynamo  # DTensor needs it: imported once here, inherited by the ranks
    import torch.distributed.tensor.parallel

    config = vars(GPTConfig.gpt2_style(n_head=args.heads, d_model=args.d_model, max_seq_len=args.seq))
    block = dense_block(config, seed=0)
    g = torch.Generator().manual_seed(1)
    x, dy = (torch.randn(args.batch, args.seq, args.d_model, generator=g) for _ in range(2))
    ranks = launch(_rank, args.ranks, config, dict(block.state_dict()), x, dy, args.rounds, args.steps,
                   args.threads, backend="gloo", timeout=600)
    med = {n: statistics.median(t for r in ranks for t in r["times"][n]) for n in ("dense", "camplib", "torch")}
    r0 = ranks[0]
    params = sum(p.numel() for p in block.parameters())
    print(f"GPT-2-style block, d_model {args.d_model}, {args.heads} heads, {params / 1e6:.2f}M parameters, "
          f"batch {args.batch} x {args.seq} tokens, t = {args.ranks} gloo ranks, {args.threads} thread(s) each, "
          f"{args.rounds} x {args.steps} timed steps each")
    for name in ("dense", "camplib", "torch"):
        diff = (r0["y"][name] - r0["y"]["dense"]).abs().max().item()
        seen = "not seen: DTensor calls c10d's functional ops, below count_bytes" if name == "torch" else \
            f"{r0['calls'][name]} ({r0['payload'][name]} bytes handed in)"
        print(f"  {name:8s} {med[name] * 1e3:8.2f} ms/step   collectives {seen}   max |y - dense| {diff:.1e}")
    print(f"  ratios: camplib / dense {med['camplib'] / med['dense']:.3f}   camplib / torch "
          f"{med['camplib'] / med['torch']:.3f}")


if __name__ == "__main__":
    main()
