"""Training throughput (tokens/s) of camplib's GPT vs transformers' GPT2LMHeadModel on CPU.

Both models get the same config and the same weights (ours is converted from the HF one), the
same byte-level batches of real text (the Python standard library's source), the same AdamW
and the same loss computed the same way from the logits, so the only difference is the model
code. Runs alternate between the two models (ours, HF, ours, HF...) so that load from other
processes on a shared machine hits both alike; the median run is reported.

    .venv/bin/python benchmarks/train_throughput.py [--threads 1] [--steps 10] [--attn eager|sdpa]
"""
from __future__ import annotations

import argparse
import statistics
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def stdlib_bytes(n_bytes: int) -> torch.Tensor:
    """The first n_bytes of the standard library's .py files, as byte ids 0..255."""
    data = bytearray()
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        data += path.read_bytes()
        if len(data) >= n_bytes:
            break
    return torch.tensor(list(data[:n_bytes]), dtype=torch.long)


def batches(data: torch.Tensor, batch: int, seq: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        chunk = torch.stack([data[s:s + seq + 1] for s in starts])
        yield chunk[:, :-1], chunk[:, 1:]


def train_steps(logits_fn, params, data, args, seed) -> tuple[float, float]:
    """warm-up + timed AdamW steps; returns (tokens/s over the timed steps, first loss)."""
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1)
    first_loss, start = None, None
    for step, (x, y) in enumerate(batches(data, args.batch, args.seq, args.warmup + args.steps, seed)):
        if step == args.warmup:
            start = time.perf_counter()
        logits = logits_fn(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        first_loss = loss.item() if first_loss is None else first_loss
    return args.steps * args.batch * args.seq / (time.perf_counter() - start), first_loss


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attn", default="eager", choices=["eager", "sdpa"],
                        help="HF attention kernel: eager (plain matmuls, like ours) or torch SDPA")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import transformers

    from camplib.hf import from_hf

    torch.manual_seed(0)
    hf_cfg = transformers.GPT2Config(vocab_size=256, n_positions=args.seq, n_embd=256, n_layer=4, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
                                     attn_implementation=args.attn)
    hf = transformers.GPT2LMHeadModel(hf_cfg).train()
    ours = from_hf(hf).train()  # same weights, copied (the two models train independently)
    data = stdlib_bytes(2_000_000)
    print(f"GPT-2 style, {ours.num_parameters() / 1e6:.2f}M parameters; batch {args.batch} x seq {args.seq}, "
          f"{args.warmup} warm-up + {args.steps} timed AdamW steps, {args.threads} thread(s), HF attention "
          f"{args.attn}, median of {args.repeats} alternating runs")

    runs = {"camplib": [], "transformers": []}
    first_losses = {}
    for r in range(args.repeats):  # fresh copies each run, so every run trains from the same start
        for name in runs:
            model = from_hf(hf).train() if name == "camplib" else transformers.GPT2LMHeadModel(hf_cfg)
            if name == "transformers":
                model.load_state_dict(hf.state_dict())
                model.train()
                fn = lambda x, m=model: m(input_ids=x).logits
            else:
                fn = lambda x, m=model: m(x)[0]
            tok_s, loss0 = train_steps(fn, model.parameters(), data, args, seed=r)
            runs[name].append(tok_s)
            first_losses.setdefault(name, loss0)
    del ours

    med = {name: statistics.median(v) for name, v in runs.items()}
    print(f"first-step loss (same weights, same batch): camplib {first_losses['camplib']:.6f}, "
          f"transformers {first_losses['transformers']:.6f}")
    for name, v in runs.items():
        print(f"{name:>12}: {med[name]:8.0f} tokens/s   (runs: {', '.join(f'{t:.0f}' for t in v)})")
    print(f"ratio camplib / transformers: {med['camplib'] / med['transformers']:.2f} (goal >= 1.0)")


if __name__ == "__main__":
    main()
