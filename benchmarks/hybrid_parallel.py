"""Lab a05's measurements, in one run: ring attention's memory per rank against full attention,
and hybrid (DP x PP x TP) training's loss difference against one process.

1. Ring attention (`camplib.parallel.context.ring.ring_attention`, zig-zag split) on cp gloo ranks,
   forward and backward: the largest tensor any op creates on a rank, over one process's plain
   attention (`camplib.attention`, which builds the (T x T) scores; theory 1/cp^2), the bytes each
   rank sends, and the max |difference| to torch's SDPA (output and q, k, v gradients).
2. camplib's GPT trained for a few AdamW steps on each layout (`camplib.parallel.hybrid.run`),
   against `reference_run` (one process, whole batch, torch's AdamW): max |loss difference| over
   the steps and parameters held per rank, fp32 and fp64.

    .venv/bin/python benchmarks/hybrid_parallel.py [--seq 256] [--steps 5]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from camplib.attention import scaled_dot_product_attention as plain_attention
from camplib.parallel.context.ring import ring_attention
from camplib.parallel.context.run import largest_full_attention_bytes, run_ring_attention
from camplib.parallel.hybrid.run import train_hybrid
from camplib.parallel.mesh import MeshShape
from camplib.parallel.reference import make_data, reference_run


def ring_table(seq: int) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(1, 4, seq, 16, generator=g) for _ in range(4))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*leaves, is_causal=True)
    (ref * grad_out).sum().backward()
    full = largest_full_attention_bytes(lambda a, b, c: plain_attention(a, b, c, is_causal=True), q, k, v, grad_out)
    print(f"ring attention, T={seq}, 4 heads of 16, fp32; full attention's largest tensor {full} B")
    print("cp  largest/rank (B)  / full  theory 1/cp^2  sent/rank (B)  max|diff| vs SDPA")
    for cp in (1, 2, 4):
        run = run_ring_attention(ring_attention, q, k, v, cp, grad_out)
        diff = max(float((run[key] - e).abs().max()) for key, e in
                   [("out", ref.detach()), ("grad_q", leaves[0].grad), ("grad_k", leaves[1].grad),
                    ("grad_v", leaves[2].grad)])
        largest = max(run["largest_bytes"])
        print(f"{cp:<3} {largest:>16}  {largest / full:6.4f}  {1 / cp**2:13.4f}  {run['bytes_sent'][0]:>13}  {diff:.1e}")


def hybrid_table(steps: int) -> None:
    config = {"vocab_size": 64, "n_layer": 4, "n_head": 4, "d_model": 32, "max_seq_len": 16, "tie_embeddings": False}
    layouts = [MeshShape(dp=2, pp=2, tp=2), MeshShape(dp=4, pp=2), MeshShape(dp=2, tp=4), MeshShape(pp=4, tp=2),
               MeshShape(dp=2, pp=2, tp=4)]
    print(f"\nhybrid training, GPT {config}, batch 16 x 16, m=2, {steps} AdamW steps vs one process")
    print("layout              ranks  dtype    max|loss diff|  params/rank (B, max)  dense params (B)")
    for dtype in ("float32", "float64"):
        spec = {"kind": "gpt", "config": config, "dtype": dtype, "seed": 0}
        data = make_data(spec, steps, 16, seed=1, seq_len=16)
        ref = reference_run(spec, data, steps, "adamw", {"lr": 1e-2})
        dense = sum(p.numel() * p.element_size() for p in ref["params"].values())
        for shape in layouts:
            got = train_hybrid(spec, data, steps, shape, m=2, hyper={"lr": 1e-2}, timeout=60)
            diff = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"]))
            print(f"{shape.describe().replace(' x cp=1', ''):<19} {shape.world_size:>5}  {dtype}  {diff:14.1e}  "
                  f"{max(got['param_bytes']):>20}  {dense:>16}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    ring_table(args.seq)
    hybrid_table(args.steps)
