"""What compression buys, measured side by side in one run (ratios against the dense / eager model):

1. Structured pruning: a GPT with half of every layer's heads and MLP channels removed by
   camplib.compress.pruning (Taylor scores on random calibration batches): parameters, bytes
   (camplib.memory.storage_bytes) and forward latency, pruned / dense.
2. Graph capture: one training step (forward + backward of the loss without graph breaks) eager
   against torch.compile (inductor): the first call's time (compilation) and the median step.
CUDA when present (bf16 weights for the size/latency part), else the CPU.

    .venv/bin/python benchmarks/compress_speed.py [--sparsity 0.5] [--threads 2] [--no-compile]
"""
from __future__ import annotations

import argparse
import copy

import torch

from camplib.compress.pruning import (
    forward_latency,
    model_size,
    prune_model,
    unit_scores,
)
from camplib.compress.static_graph import loss_without_breaks, time_steps
from camplib.model import GPT, GPTConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=512, n_layer=args.layers, n_head=8, d_model=args.d_model, max_seq_len=args.seq)
    dense = GPT(cfg).to(device)
    x = torch.randint(0, 512, (args.batch, args.seq), device=device)
    y = torch.randint(0, 512, (args.batch, args.seq), device=device)
    print(f"device {device}, dtype {dtype}, threads {torch.get_num_threads()}, GPT d={args.d_model} x {args.layers} "
          f"layers, batch {args.batch} x {args.seq}")

    pruned = copy.deepcopy(dense)
    prune_model(pruned, unit_scores(pruned, [(x, y)]), args.sparsity, args.sparsity)
    rows = {}
    for name, model in [("dense", dense), ("pruned", pruned)]:
        m = copy.deepcopy(model).to(dtype).eval()
        rows[name] = {**model_size(m), "seconds": forward_latency(m, x, repeats=args.repeats)}
    print(f"\n1. pruning {args.sparsity:.0%} of heads and MLP channels (embeddings kept)")
    print(f"{'':>8} {'parameters':>12} {'bytes':>12} {'forward ms':>11}")
    for name, r in rows.items():
        print(f"{name:>8} {r['parameters']:>12,} {r['bytes']:>12,} {r['seconds'] * 1e3:>11.2f}")
    d, p = rows["dense"], rows["pruned"]
    print(f"{'ratio':>8} {p['parameters'] / d['parameters']:>12.3f} {p['bytes'] / d['bytes']:>12.3f} "
          f"{p['seconds'] / d['seconds']:>11.3f}   (pruned / dense)")

    if args.no_compile:
        return
    print("\n2. one training step, eager vs torch.compile (inductor)")

    def step(fn):
        def run():
            dense.zero_grad(set_to_none=True)
            fn(dense, x, y).backward()
        return run

    eager = time_steps(step(loss_without_breaks), n=args.repeats, device=device)
    torch._dynamo.reset()
    compiled_fn = torch.compile(loss_without_breaks, fullgraph=True)
    compiled = time_steps(step(compiled_fn), n=args.repeats, device=device)
    with torch.no_grad():
        diff = float((compiled_fn(dense, x, y) - loss_without_breaks(dense, x, y)).abs())
    print(f"first call: eager {eager['first']:.2f} s, compiled {compiled['first']:.2f} s (compilation)")
    print(f"median step: eager {eager['median'] * 1e3:.2f} ms, compiled {compiled['median'] * 1e3:.2f} ms: "
          f"compiled / eager = {compiled['median'] / eager['median']:.3f}; |loss difference| {diff:.2e}")


if __name__ == "__main__":
    main()
