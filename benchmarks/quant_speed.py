"""Quantized Linear layers against fp32, side by side in one run: bytes stored and time per forward.

For one Linear (d_in x d_out) the weight-only layers of camplib.quant.layers (int8 per channel,
int4 groups of 128, NF4 blocks of 64 with and without double quantization) and LLM.int8()
(camplib.quant.llm_int8) are timed on a batch of `tokens` inputs against nn.Linear, as ratios.
They dequantize the whole weight in every forward (plain PyTorch, no fused kernel), so on a CPU
they are *slower* than fp32: what they buy here is bytes; the speed needs a kernel that reads the
small codes and dequantizes in registers (bitsandbytes, Marlin, llama.cpp).

    .venv/bin/python benchmarks/quant_speed.py [--d-in 1024] [--d-out 4096] [--tokens 1 64] [--repeat 20]
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from camplib.memory import storage_bytes
from camplib.quant.layers import QuantLinear
from camplib.quant.llm_int8 import Int8OutlierLinear


def best_time(fn, x, repeat: int) -> float:
    with torch.no_grad():
        fn(x)
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-in", type=int, default=1024)
    ap.add_argument("--d-out", type=int, default=4096)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    lin = nn.Linear(args.d_in, args.d_out)
    layers = {"int8 per channel": QuantLinear(lin, "int8"), "int4 groups of 128": QuantLinear(lin, "int4", 128),
              "NF4 blocks of 64": QuantLinear(lin, "nf4", 64), "NF4 + double quant": QuantLinear(lin, "nf4", 64, True),
              "LLM.int8() (threshold 6)": Int8OutlierLinear(lin)}
    fp32_bytes = storage_bytes([lin.weight])
    print(f"Linear {args.d_in} -> {args.d_out}, fp32 weight {fp32_bytes / 2**20:.2f} MiB, {args.threads} threads, "
          f"best of {args.repeat}")
    header = f"{'layer':26} {'bytes fp32/x':>12} {'bits/weight':>11}" + "".join(f" {'time x/fp32 @' + str(t):>16}" for t in args.tokens)
    print(header)
    base = {t: best_time(lin, torch.randn(t, args.d_in), args.repeat) for t in args.tokens}
    for name, layer in layers.items():
        stored = layer.weight_bytes() if isinstance(layer, QuantLinear) else storage_bytes([layer.weight_codes, layer.weight_absmax])
        ratios = [best_time(layer, torch.randn(t, args.d_in), args.repeat) / base[t] for t in args.tokens]
        print(f"{name:26} {fp32_bytes / stored:12.2f} {stored * 8 / lin.weight.numel():11.3f}"
              + "".join(f" {r:16.2f}" for r in ratios))
    print("fp32 time per forward: " + ", ".join(f"{t} tokens {base[t] * 1e3:.2f} ms" for t in args.tokens))


if __name__ == "__main__":
    main()
