"""Memory against time, side by side in one run: activation checkpointing and a fused kernel.

1. A small GPT trained for a few steps with and without camplib.activation_checkpoint: time per
   training step (checkpointing reruns each block's forward in backward) and the bytes autograd
   saves for backward (checkpointed: only the block inputs), plus, on CUDA, the peak allocated
   memory of a training step.
2. LayerNorm+GELU eager (two kernels) against torch.compile's fused kernel (compiled once,
   warmed up, then timed on the same inputs; reports why when it could not compile).
CUDA when present, else the CPU.

    .venv/bin/python benchmarks/memory_speed.py [--steps 10] [--threads 2] [--no-compile]
"""
from __future__ import annotations

import argparse
import time

import torch

from camplib.activation_checkpoint import enable_checkpointing
from camplib.fused import compile_layernorm_gelu, layernorm_gelu
from camplib.memory import saved_activation_bytes
from camplib.model import GPT, GPTConfig


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_it(fn, device, repeats: int) -> float:
    """Median seconds of fn() over `repeats` runs (after the caller's warm-up)."""
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def checkpointing_side_by_side(device, steps: int, cfg: GPTConfig, batch: int):
    torch.manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len), device=device)
    y = torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len), device=device)
    rows = {}
    for name, checkpointed in [("plain", False), ("checkpointed", True)]:
        torch.manual_seed(0)
        model = enable_checkpointing(GPT(cfg).to(device), enabled=checkpointed)
        existing = list(model.parameters()) + list(model.buffers())
        saved, out = saved_activation_bytes(model, x, y, exclude=existing)
        del out

        def train_step():
            model.zero_grad(set_to_none=True)
            model(x, y)[1].backward()

        train_step()  # warm-up
        peak = None
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            train_step()
            peak = torch.cuda.max_memory_allocated() - base
        rows[name] = (time_it(train_step, device, steps), saved, peak)
    return rows


def fused_side_by_side(device, repeats: int, compile_enabled: bool, shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(device)
    w, b = torch.randn(shape[-1], generator=g).to(device), torch.randn(shape[-1], generator=g).to(device)
    fused = compile_layernorm_gelu(x, w, b, enabled=compile_enabled)
    with torch.no_grad():
        for _ in range(3):  # warm-up both
            fused(x, w, b)
            layernorm_gelu(x, w, b)
        max_diff = (fused(x, w, b) - layernorm_gelu(x, w, b)).abs().max().item()
        eager = time_it(lambda: layernorm_gelu(x, w, b), device, repeats)
        compiled = time_it(lambda: fused(x, w, b), device, repeats)
    return fused, eager, compiled, max_diff


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (reported as not fused)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        cfg, batch, shape = GPTConfig(vocab_size=8192, n_layer=12, n_head=12, d_model=768, max_seq_len=1024), 8, (16, 1024, 4096)
    else:
        cfg, batch, shape = GPTConfig(vocab_size=512, n_layer=6, n_head=4, d_model=128, max_seq_len=128), 8, (64, 128, 512)
    print(f"device {device}, torch {torch.__version__}, {args.threads} CPU threads")

    print(f"\n1. activation checkpointing: GPT {cfg.n_layer} layers, d_model {cfg.d_model}, "
          f"batch {batch} x {cfg.max_seq_len} tokens, forward+backward, median of {args.steps}")
    rows = checkpointing_side_by_side(device, args.steps, cfg, batch)
    for name, (sec, saved, peak) in rows.items():
        peak_text = f", peak {peak / 2**20:8.1f} MiB" if peak is not None else ""
        print(f"   {name:13s} {sec * 1e3:8.1f} ms/step, saved activations {saved / 2**20:8.2f} MiB{peak_text}")
    (t0, s0, p0), (t1, s1, p1) = rows["plain"], rows["checkpointed"]
    print(f"   checkpointed / plain: time x{t1 / t0:.2f}, saved-activation bytes x{s1 / s0:.3f}"
          + (f", peak memory x{p1 / p0:.3f}" if p0 else ""))

    print(f"\n2. LayerNorm+GELU on {shape} fp32, median of {10 * args.steps}")
    fused, eager, compiled, max_diff = fused_side_by_side(device, 10 * args.steps, not args.no_compile, shape)
    if fused.fused:
        print(f"   compiled once in {fused.compile_seconds:.1f} s; max |fused - eager| = {max_diff:.2e}")
        print(f"   eager {eager * 1e3:.3f} ms, fused {compiled * 1e3:.3f} ms: fused / eager time x{compiled / eager:.2f}")
    else:
        print(f"   NOT fused ({fused.reason}): eager {eager * 1e3:.3f} ms, the fallback {compiled * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
