"""The alpha-beta cost model of data-parallel training: what a step costs on N ranks, and so how
well training scales, from two numbers per link (Hockney 1994; Thakur, Rabenseifner and Gropp
2005, "Optimization of collective communication operations in MPICH"):

- sending a message of S bytes takes alpha + S * beta (alpha: latency per message, seconds;
  beta: seconds per byte, 1 / bandwidth);
- ring all-reduce (reduce-scatter then all-gather, 2(N-1) steps of S/N bytes each):
  2(N-1) * alpha + 2(N-1)/N * S * beta. Bandwidth-optimal; its latency term grows with N;
- tree all-reduce (reduce up a binary tree, broadcast back down, whole messages):
  2 * ceil(log2 N) * (alpha + S * beta). Latency grows with log N only, every hop carries all of
  S: better for small messages on many ranks, worse for big ones (NCCL pipelines its trees in
  chunks to get both; this is the unpipelined textbook tree);
- compression changes S: fp32 gradients are 4 bytes per value, fp16 2, int8 with one fp32 scale
  per block of B values 1 + 4/B. Quantizing costs compute too: `codec_s_per_value` seconds per
  value encoded and decoded, paid on each of the ring's 2(N-1) hops on S/N values (camplib's
  compressed ring re-quantizes every partial sum of the reduce-scatter);
- a step: compute c (forward + backward, the backward a fraction f of it), then the all-reduce.
  With overlap (buckets all-reduced while backward runs, lab b06) at most f * c of the
  communication hides behind backward: step = c + max(0, comm - f * c); without, c + comm.
  Weak scaling (a fixed batch per rank): scaling efficiency = c / step (1 rank: no
  communication, efficiency 1).

`camplib.parallel.data.scaling_run` measures collectives and steps on gloo ranks; `fit_alpha_beta`
fits alpha and beta to them, and benchmarks/compression_scaling.py compares the model's
predicted step times with measured ones, then predicts 2 to 1,024 GPUs from `LINKS`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Link", "LINKS", "BYTES_PER_VALUE", "bytes_per_value", "all_reduce_time", "step_time",
           "scaling_efficiency", "predict_scaling", "fit_alpha_beta"]


@dataclass(frozen=True)
class Link:
    """alpha: seconds per message; beta: seconds per byte (1 / bytes per second); where from."""
    alpha: float
    beta: float
    source: str = ""


# Nominal figures, per GPU and direction (the model's inputs, not measurements of ours):
# - NVLink 4 (H100/H200 SXM, one node of 8): 900 GB/s bidirectional per GPU, 450 GB/s each way
#   (NVIDIA H100 datasheet); alpha 2 us, the order of NCCL's per-step latency within a node.
# - InfiniBand NDR (DGX H100: one ConnectX-7 400 Gb/s port per GPU, NVIDIA DGX H100 user guide):
#   50 GB/s each way; alpha 5 us (RDMA ~1-2 us plus NCCL's per-step overhead across nodes).
# - 100 Gb Ethernet: 12.5 GB/s, alpha 10 us; 10 Gb Ethernet: 1.25 GB/s, alpha 20 us (TCP).
LINKS = {
    "nvlink4": Link(2e-6, 1 / 450e9, "NVLink 4, 450 GB/s per direction per GPU (H100/H200 SXM datasheet)"),
    "ib-ndr400": Link(5e-6, 1 / 50e9, "InfiniBand NDR 400 Gb/s per GPU (DGX H100: 8 x ConnectX-7)"),
    "eth-100g": Link(10e-6, 1 / 12.5e9, "100 Gb/s Ethernet per GPU"),
    "eth-10g": Link(20e-6, 1 / 1.25e9, "10 Gb/s Ethernet per GPU"),
}

BYTES_PER_VALUE = {"none": 4.0, "fp32": 4.0, "bf16": 2.0, "fp16": 2.0}


def bytes_per_value(method: str, block: int = 256) -> float:
    """Bytes one gradient value takes on the wire: fp32 4, fp16/bf16 2, int8 1 + 4/block."""
    if method == "int8":
        return 1.0 + 4.0 / block
    if method not in BYTES_PER_VALUE:
        raise ValueError(f"unknown method {method!r}: expected one of {sorted(BYTES_PER_VALUE) + ['int8']}")
    return BYTES_PER_VALUE[method]


def all_reduce_time(nbytes: float, n: int, alpha: float, beta: float, algorithm: str = "ring",
                    codec_s_per_value: float = 0.0, values: float = 0.0) -> float:
    """Seconds to all-reduce `nbytes` over `n` ranks (`values` of them, for the codec's cost)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n == 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (n - 1) * (alpha + nbytes / n * beta + codec_s_per_value * values / n)
    if algorithm == "tree":
        return 2 * math.ceil(math.log2(n)) * (alpha + nbytes * beta + codec_s_per_value * values)
    raise ValueError(f"unknown algorithm {algorithm!r} (expected 'ring' or 'tree')")


def step_time(compute_s: float, comm_s: float, overlap: bool = True, backward_fraction: float = 2 / 3) -> float:
    """A step: compute, then what of the communication backward could not hide."""
    hidden = min(comm_s, backward_fraction * compute_s) if overlap else 0.0
    return compute_s + comm_s - hidden


def scaling_efficiency(n_params: float, n: int, compute_s: float, alpha: float, beta: float, method: str = "none",
                       algorithm: str = "ring", overlap: bool = True, backward_fraction: float = 2 / 3,
                       block: int = 256, codec_s_per_value: float = 0.0) -> float:
    """Weak-scaling efficiency on n ranks: compute / step, the gradients (n_params values)
    all-reduced with `method` ("none" = fp32, "bf16", "fp16", "int8")."""
    codec = codec_s_per_value if method not in ("none", "fp32") else 0.0
    comm = all_reduce_time(n_params * bytes_per_value(method, block), n, alpha, beta, algorithm, codec, n_params)
    return compute_s / step_time(compute_s, comm, overlap, backward_fraction)


def predict_scaling(n_params: float, compute_s: float, link: Link, ranks=(2, 4, 8, 16, 64, 256, 1024),
                    methods=("none", "int8"), algorithm: str = "ring", overlap: bool = True,
                    backward_fraction: float = 2 / 3, codec_s_per_value: float = 0.0) -> list[dict]:
    """One row per rank count: {"n", method: efficiency, f"{method}_comm_s": seconds}."""
    rows = []
    for n in ranks:
        row = {"n": n}
        for m in methods:
            codec = codec_s_per_value if m not in ("none", "fp32") else 0.0
            row[f"{m}_comm_s"] = all_reduce_time(n_params * bytes_per_value(m), n, link.alpha, link.beta, algorithm,
                                                 codec, n_params)
            row[m] = scaling_efficiency(n_params, n, compute_s, link.alpha, link.beta, m, algorithm, overlap,
                                        backward_fraction, codec_s_per_value=codec_s_per_value)
        rows.append(row)
    return rows


def fit_alpha_beta(samples: list[tuple[int, float, float]]) -> Link:
    """Alpha and beta of the ring model fitted to measured ring all-reduces, samples of (ranks N,
    bytes S, seconds), minimising the squared RELATIVE error of 2(N-1) alpha + 2(N-1)/N S beta
    (plain least squares would fit the largest messages and ignore the latency-bound ones)."""
    used = [(n, s, sec) for n, s, sec in samples if n > 1 and sec > 0]
    if len(used) < 2:
        raise ValueError("fit_alpha_beta needs at least two samples with N > 1")
    a = torch.tensor([(2.0 * (n - 1) / sec, 2.0 * (n - 1) / n * s / sec) for n, s, sec in used], dtype=torch.float64)
    t = torch.ones(len(used), 1, dtype=torch.float64)
    scale = a.abs().amax(dim=0).clamp_min(1e-300)          # columns of very different sizes
    sol = torch.linalg.lstsq(a / scale, t).solution.reshape(-1) / scale
    return Link(max(float(sol[0]), 0.0), max(float(sol[1]), 0.0), f"fitted to {len(used)} measured all-reduces")
