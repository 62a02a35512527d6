"""camplib's DataParallel against torch's DistributedDataParallel, and the ring all-reduce
against dist.all_reduce, side by side on the same ranks in one run (gloo on CPU by default).

1. Step time (forward, backward, gradient sync, SGD step) of the same GPT (a few M parameters)
   wrapped by camplib.parallel.DataParallel and by DDP, same bucket size (4 MB), blocks of
   steps alternating between the two so that noise from other processes hits both alike.
   Goal: ratio camplib / DDP <= 1.15.
2. One all-reduce of 1, 4, 16 and 64 MB: camplib.dist.ring.ring_all_reduce (sends and receives
   in Python) against dist.all_reduce (gloo's own algorithm, in C++).

    .venv/bin/python benchmarks/data_parallel_speed.py [--ranks 2] [--rounds 4] [--steps 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from camplib.dist import launch
from camplib.dist.ring import ring_all_reduce
from camplib.model import GPT, GPTConfig
from camplib.parallel.data.wrapper import DataParallel

MODEL = dict(vocab_size=4096, n_layer=4, n_head=4, d_model=256, max_seq_len=64)


def _step(model, opt, x, y, sync) -> float:
    start = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    model(x, y)[1].backward()
    if sync is not None:
        sync()
    opt.step()
    return time.perf_counter() - start


def _steps_rank(rank, world_size, rounds, steps, bucket_mb, batch, threads):
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(threads)
    cfg = GPTConfig(**MODEL)
    torch.manual_seed(0)
    ours, theirs = GPT(cfg), GPT(cfg)
    theirs.load_state_dict(ours.state_dict())
    dp = DataParallel(ours, bucket_mb=bucket_mb)
    ddp = DistributedDataParallel(theirs, bucket_cap_mb=bucket_mb)
    runs = {"camplib": (dp, torch.optim.SGD(ours.parameters(), lr=1e-3), dp.finish_gradient_sync),
            "ddp": (ddp, torch.optim.SGD(theirs.parameters(), lr=1e-3), None)}
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len), generator=g)
    y = torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len), generator=g)
    times = {name: [] for name in runs}
    for name, (model, opt, sync) in runs.items():   # warm-up
        for _ in range(2):
            _step(model, opt, x, y, sync)
    for r in range(rounds):
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            model, opt, sync = runs[name]
            dist.barrier()
            times[name] += [_step(model, opt, x, y, sync) for _ in range(steps)]
    params = sum(p.numel() for p in ours.parameters())
    return {"times": times, "params": params, "buckets": len(dp.buckets)}


def _allreduce_rank(rank, world_size, sizes_mb, reps, threads):
    torch.set_num_threads(threads)
    out = {}
    for mb in sizes_mb:
        t = torch.full((mb * 2**20 // 4,), float(rank + 1))
        timings = {"ring": [], "torch": []}
        for rep in range(reps + 1):
            for name, fn in (("ring", ring_all_reduce), ("torch", dist.all_reduce)):
                work = t.clone()
                dist.barrier()
                start = time.perf_counter()
                fn(work)
                if rep:   # the first repetition warms up
                    timings[name].append(time.perf_counter() - start)
                expected = world_size * (world_size + 1) / 2
                assert work[0].item() == expected and work[-1].item() == expected
        out[mb] = {k: statistics.median(v) for k, v in timings.items()}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--bucket-mb", type=float, default=4.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args()

    ranks = launch(_steps_rank, args.ranks, args.rounds, args.steps, args.bucket_mb, args.batch, args.threads,
                   timeout=600)
    r0 = ranks[0]
    print(f"GPT {r0['params'] / 1e6:.1f}M parameters ({r0['params'] * 4 / 2**20:.0f} MB of fp32 gradients), "
          f"{args.ranks} ranks on {dist.Backend.GLOO if not torch.cuda.is_available() else 'the default backend'}, "
          f"batch {args.batch} x {MODEL['max_seq_len']} per rank, bucket {args.bucket_mb:g} MB "
          f"({r0['buckets']} buckets), {args.rounds} x {args.steps} timed steps each")
    med = {name: statistics.median(t for r in ranks for t in r["times"][name]) for name in ("camplib", "ddp")}
    print(f"  step time  camplib DataParallel {med['camplib'] * 1e3:8.1f} ms   torch DDP {med['ddp'] * 1e3:8.1f} ms   "
          f"ratio {med['camplib'] / med['ddp']:.3f} (goal <= 1.15)")

    sizes = [1, 4, 16, 64]
    result = launch(_allreduce_rank, args.ranks, sizes, args.reps, args.threads, timeout=600)[0]
    print(f"all-reduce of one fp32 tensor, {args.ranks} ranks, median of {args.reps}")
    for mb in sizes:
        ring, ref = result[mb]["ring"], result[mb]["torch"]
        print(f"  {mb:3d} MB  ring_all_reduce {ring * 1e3:8.1f} ms   dist.all_reduce {ref * 1e3:8.1f} ms   "
              f"ratio {ring / ref:.2f}")


if __name__ == "__main__":
    main()
