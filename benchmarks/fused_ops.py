"""The fused operators of camplib.kernels against their unfused references, side by side in one
run: bytes autograd saves for backward (camplib.memory.saved_activation_bytes), estimated bytes
moved per forward+backward, and the time of a forward+backward, as ratios fused / unfused.

- RMSNorm: camplib.kernels.fused_norm.rms_norm (what camplib.model.RMSNorm runs) vs Hugging Face
  Llama's LlamaRMSNorm (the formula written out)
- SwiGLU gate: camplib.kernels.fused_swiglu.swiglu vs F.silu(a) * b
- LM-head cross-entropy: camplib.kernels.chunked_ce.chunked_cross_entropy vs
  camplib.losses.cross_entropy(h @ W.T, y) on the full logits

These are PyTorch-level fusions (fewer saved tensors, recomputation in backward), not single GPU
kernels: on the CPU they save memory and may or may not save time; the table says which. CUDA
when present (synchronised around every timing), else the CPU. Alternating runs, median.

    .venv/bin/python benchmarks/fused_ops.py [--tokens 2048] [--d 512] [--vocab 16000] [--repeats 5] [--clock wall|process]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from camplib.kernels.chunked_ce import chunked_cross_entropy
from camplib.kernels.fused_norm import rms_norm
from camplib.kernels.fused_swiglu import swiglu
from camplib.losses import cross_entropy
from camplib.memory import saved_activation_bytes


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


CLOCK = time.perf_counter   # --clock process: this process's CPU time (a shared CPU's other jobs not counted)


def fwd_bwd_seconds(fn, inputs, device) -> float:
    """One forward + backward of fn(*inputs) (inputs are leaves that require grad)."""
    sync(device)
    start = CLOCK()
    out = fn(*inputs)
    out.backward(torch.ones_like(out))
    sync(device)
    for t in inputs:
        t.grad = None
    return CLOCK() - start


def compare(name, fused, unfused, inputs, exclude, moved, repeats, device):
    """Row of the table: saved bytes, bytes moved, median time for fused and unfused."""
    saved = {}
    for label, fn in (("fused", fused), ("unfused", unfused)):
        saved[label], out = saved_activation_bytes(fn, *inputs, exclude=exclude)
        del out
    for fn in (fused, unfused):                    # warm-up
        fwd_bwd_seconds(fn, inputs, device)
    times = {"fused": [], "unfused": []}
    for _ in range(repeats):                       # alternating, so machine load hits both alike
        times["fused"].append(fwd_bwd_seconds(fused, inputs, device))
        times["unfused"].append(fwd_bwd_seconds(unfused, inputs, device))
    t = {k: statistics.median(v) for k, v in times.items()}
    print(f"{name:<22} {saved['fused'] / 2**10:9.0f} {saved['unfused'] / 2**10:9.0f} {saved['fused'] / max(saved['unfused'], 1):6.2f}"
          f" {moved['fused'] / 2**20:10.1f} {moved['unfused'] / 2**20:9.1f} {moved['fused'] / moved['unfused']:6.2f}"
          f" {t['fused'] * 1e3:9.2f} {t['unfused'] * 1e3:9.2f} {t['fused'] / t['unfused']:6.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--ff", type=int, default=1376)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    parser.add_argument("--clock", default="wall", choices=["wall", "process"])
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "process" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and args.clock == "process":
        parser.error("--clock process measures CPU time: use it on the CPU only")
    g = torch.Generator().manual_seed(0)
    leaf = lambda *shape, scale=1.0: (torch.randn(*shape, generator=g) * scale).to(device).requires_grad_()
    N, d, ff, V, f32 = args.tokens, args.d, args.ff, args.vocab, 4
    print(f"{device.type}, {torch.get_num_threads()} thread(s), fp32, {N} tokens, d {d}, d_ff {ff}, vocab {V}, chunk {args.chunk}; "
          f"forward+backward, median of {args.repeats} alternating runs, {args.clock} clock; ratio = fused / unfused")
    print(f"{'op':<22} {'saved KiB':>9} {'(unfused)':>9} {'ratio':>6} {'~moved MiB':>10} {'(unfused)':>9} {'ratio':>6}"
          f" {'ms':>9} {'(unfused)':>9} {'ratio':>6}")

    # bytes moved, counted per tensor read or written once (forward + backward), fp32:
    # RMSNorm fused: fwd reads x writes y; bwd reads x, dy writes dx (x_hat recomputed); unfused also writes
    # and rereads x_hat and the squares (about 3 more passes over x).
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(d, eps=1e-6).to(device)
    x = leaf(N, d)
    compare("RMSNorm", lambda x: rms_norm(x, norm.weight, norm.variance_epsilon), norm, [x], list(norm.parameters()),
            {"fused": 5 * N * d * f32, "unfused": 9 * N * d * f32}, args.repeats, device)
    # SwiGLU gate: fused fwd reads a, b writes h; bwd reads a, b, dh writes da, db (8 passes);
    # unfused also writes silu(a) and rereads it in backward and in the product (about 11 passes).
    a, b = leaf(N, ff, scale=2), leaf(N, ff, scale=2)
    compare("SwiGLU gate", swiglu, lambda a, b: F.silu(a) * b, [a, b], [],
            {"fused": 8 * N * ff * f32, "unfused": 11 * N * ff * f32}, args.repeats, device)
    # LM-head CE: the unfused one writes the (N, V) logits, rereads them (softmax, grad) and writes
    # their gradient: ~4 passes over N x V; the chunked one keeps each chunk's logits in cache-sized
    # pieces (counted as 2 passes: written and read once per matmul) plus W read 3 times.
    h, w = leaf(N, d), leaf(V, d, scale=0.02)
    y = torch.randint(0, V, (N,), generator=g).to(device)
    compare("LM-head cross-entropy", lambda h, w: chunked_cross_entropy(h, w, y, chunk_size=args.chunk),
            lambda h, w: cross_entropy(h @ w.T, y), [h, w], [y],
            {"fused": (2 * N * V + 3 * V * d + 3 * N * d) * f32, "unfused": (4 * N * V + 2 * V * d + 3 * N * d) * f32},
            args.repeats, device)


if __name__ == "__main__":
    main()
