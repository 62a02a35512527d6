"""ZeRO memory per rank against the paper's formula, and communication per step, side by side.

For each precision (fp32: 4 + 4 + 8 bytes per parameter; mixed: bf16 params and grads, fp32
master + exp_avg + exp_avg_sq, K = 12), each N and each stage 0-3, one run of camplib's
ZeroAdamW on N forked ranks (gloo, CPU): bytes held by rank 0 after a step (distinct storages of
parameters, gradients, optimizer state) next to the formula, their ratio, and the bytes rank 0
sent per step on the ring collectives (every byte a visible send) in units of Ψ * 4 (fp32) or
Ψ * 2 (mixed): ~2(N-1)/N for stages 0-2, ~3(N-1)/N for stage 3. The last column is the peak of
gradient bytes held during backward (measured from outside the optimizer: every .grad and
gradient buffer, after each accumulation) in units of the full gradients' g * Ψ: 1 for stages
0-1; for stages 2-3, which reduce-scatter bucket by bucket (--bucket-kb) or layer by layer,
1/N (the shard) plus the largest bucket or layer, not the full gradients on top of the shard.

    .venv/bin/python benchmarks/zero_memory.py [--sizes 64 256 256 64] [--ranks 2 4] [--bucket-kb 64]
"""
from __future__ import annotations

import argparse

from camplib.parallel.zero.memory import PRECISIONS, zero_memory_formula
from camplib.parallel.zero.run import make_data, train_zero_on_ranks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 256, 64], help="MLP layer widths")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--bucket-kb", type=float, default=64.0, help="ZeroAdamW gradient bucket size (KiB)")
    args = parser.parse_args()
    hyper = dict(lr=1e-3, weight_decay=0.1, bucket_mb=args.bucket_kb / 1024)
    print(f"{'prec':>5} {'N':>2} {'stage':>5} {'held MiB':>9} {'formula MiB':>11} {'ratio':>7} "
          f"{'params':>7} {'grads':>7} {'optim':>7} {'sent/step':>10} {'x Ψ·bytes':>10} {'peak/gΨ':>8}")
    for precision, dtype in (("fp32", "float32"), ("mixed", "bfloat16")):
        spec = {"kind": "mlp", "sizes": args.sizes, "seed": 0, "dtype": dtype}
        data = make_data(spec, args.steps, batch=4 * max(args.ranks))
        for n in args.ranks:
            base = None
            for stage in range(4):
                out = train_zero_on_ranks(stage, n, spec, data, args.steps, hyper, ring=True)
                psi, held = out["n_params"][0], out["memory"][0]
                f = zero_memory_formula(psi, n, stage, *PRECISIONS[precision])
                sent = out["bytes_per_step"][0][-1]
                base = base or sent
                parts = " ".join(f"{held[k] / f[k]:7.4f}" for k in ("params", "grads", "optimizer"))
                print(f"{precision:>5} {n:>2} {stage:>5} {held['total'] / 2**20:9.3f} {f['total'] / 2**20:11.3f} "
                      f"{held['total'] / f['total']:7.4f} {parts} {sent:10d} "
                      f"{sent / (psi * PRECISIONS[precision][0]):10.3f} {out['peak_grad_bytes'][0] / (psi * PRECISIONS[precision][1]):8.3f}")
            print(f"{'':>5} {n:>2} Ψ = {psi} parameters; stage 3 / stage 1 bytes sent = {sent / base:.3f} "
                  f"(expected 1.5); ratio columns: measured / formula per part; "
                  f"buckets of {args.bucket_kb:g} KiB")


if __name__ == "__main__":
    main()
