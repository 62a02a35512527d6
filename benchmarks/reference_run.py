"""CPU reference run: a small code model trained from scratch on the Python standard library
with the course's own pieces (ByteBPE, the hash split, packing, GPT, AdamW, warm-up + cosine),
for a fixed wall-clock budget; prints the validation loss it reaches. The README quotes it.

  .venv/bin/python benchmarks/reference_run.py --minutes 5
"""
from __future__ import annotations

import argparse
import math
import time

import torch

from camplib.data import make_loader, pack, read_corpus, split_files, stdlib_files
from camplib.model import GPT, GPTConfig
from camplib.optim import AdamW, clip_grad_norm_, decay_param_groups
from camplib.schedule import warmup_cosine
from camplib.tokenizer import ByteBPE


@torch.no_grad()
def evaluate(model, blocks: torch.Tensor, batch_size: int) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(blocks), batch_size):
        b = blocks[i:i + batch_size]
        _, loss = model(b[:, :-1], b[:, 1:])
        total += loss.item() * b.numel()
        count += b.numel()
    model.train()
    return total / count


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--train-mb", type=float, default=8.0, help="megabytes of stdlib source to train on")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    train_files, val_files = split_files(stdlib_files())
    train_docs, val_docs = read_corpus(train_files), read_corpus(val_files)
    budget, kept = int(args.train_mb * 2**20), []
    for doc in train_docs:
        if budget <= 0:
            break
        kept.append(doc)
        budget -= len(doc.encode())
    tok = ByteBPE.train(kept[: max(1, len(kept) // 4)], args.vocab, special_tokens=["<|eos|>"])
    eos = tok.vocab_size - 1
    train = pack([tok.encode(d) for d in kept], args.block, eos)
    val = pack([tok.encode(d) for d in val_docs], args.block, eos)[:256]
    prep = time.perf_counter() - t0
    print(f"data: {len(kept)} train files ({sum(len(d) for d in kept) / 2**20:.1f} MB), {len(val_docs)} val files; "
          f"{len(train)} train blocks, {len(val)} val blocks of {args.block}; tokenizer + packing {prep:.0f} s")

    cfg = GPTConfig.llama_style(vocab_size=tok.vocab_size, n_layer=4, n_head=4, n_kv_head=2, d_model=192,
                                max_seq_len=args.block)
    model = GPT(cfg)
    print(f"model: {model.num_parameters() / 1e6:.2f} M parameters (llama style, GQA, RoPE)")
    opt = AdamW(decay_param_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95))
    budget_s = args.minutes * 60
    est_steps = 10_000   # schedule horizon; the run stops on time, cosine is re-based below
    step, tokens, start, epoch = 0, 0, time.perf_counter(), 0
    history = []
    while time.perf_counter() - start < budget_s:
        for x, y in make_loader(train, args.batch, seed=0, epoch=epoch):
            elapsed = time.perf_counter() - start
            if elapsed >= budget_s:
                break
            # lr follows the fraction of the time budget used, so any budget gets a full schedule
            frac = elapsed / budget_s
            lr = warmup_cosine(int(frac * est_steps), est_steps // 50, est_steps, 3e-3, 3e-4)
            for group in opt.param_groups:
                group["lr"] = lr
            _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            tokens += x.numel()
            if step % 100 == 0:
                history.append((time.perf_counter() - start, step, loss.item()))
                print(f"  {history[-1][0] / 60:5.2f} min  step {step:5d}  train loss {loss.item():.3f}", flush=True)
        epoch += 1
    train_s = time.perf_counter() - start
    val_loss = evaluate(model, val, 32)
    print(f"\ntrained {step} steps, {tokens / 1e6:.2f} M tokens in {train_s / 60:.1f} min "
          f"({tokens / train_s:.0f} tokens/s) on {args.threads} threads")
    print(f"validation loss {val_loss:.3f} nats/token (perplexity {math.exp(val_loss):.1f}); "
          f"uniform over the vocabulary would be {math.log(tok.vocab_size):.3f}")


if __name__ == "__main__":
    main()
