"""Time per generated token with and without the KV cache, side by side in one run.

Without a cache, step t reruns the model over all prompt + t tokens, so its cost grows with
the position; with one, each step runs a single token against cached keys/values and stays
almost flat. The loop below is camplib.generate's greedy loop with a timer around each model
call (first point: the prefill); the two runs must produce the same tokens.

    .venv/bin/python benchmarks/kv_cache_speed.py [--new-tokens 256] [--out plot.png]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from camplib.generate import generate
from camplib.model import GPT, GPTConfig


@torch.no_grad()
def timed_greedy(model: GPT, prompt: torch.Tensor, new_tokens: int, use_cache: bool):
    """Greedy decoding; returns (tokens, seconds spent producing each new token)."""
    caches = model.new_caches(prompt.size(0), prompt.size(1) + new_tokens) if use_cache else None
    idx, times = prompt, []
    start = time.perf_counter()
    logits, _ = model(idx, caches=caches)
    for step in range(new_tokens):
        next_tok = logits[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat([idx, next_tok], dim=1)
        times.append(time.perf_counter() - start)
        start = time.perf_counter()
        if step + 1 < new_tokens:
            logits, _ = model(next_tok, caches=caches) if use_cache else model(idx)
    return idx, times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kv_cache_speed.png"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    cfg = GPTConfig.gpt2_style(vocab_size=4096, n_layer=6, n_head=6, d_model=384,
                               max_seq_len=args.prompt_len + args.new_tokens)
    model = GPT(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt_len))
    print(f"model: {model.num_parameters() / 1e6:.1f}M parameters ({cfg.n_layer} layers, d_model "
          f"{cfg.d_model}), prompt {args.prompt_len} tokens, {args.new_tokens} new, {args.threads} threads")

    timed_greedy(model, prompt, 8, True)  # warm-up (allocator, first-call costs)
    timed_greedy(model, prompt, 8, False)
    with_cache, t_cache = timed_greedy(model, prompt, args.new_tokens, use_cache=True)
    without, t_full = timed_greedy(model, prompt, args.new_tokens, use_cache=False)
    if not torch.equal(with_cache, without):
        raise SystemExit("cached and uncached greedy decoding disagree")
    if not torch.equal(with_cache, generate(model, prompt, args.new_tokens)):
        raise SystemExit("timed loop disagrees with camplib.generate")

    # per-token means over the decoding steps (the prefill, step 0, is the same work in both)
    ms_cache = 1e3 * sum(t_cache[1:]) / (len(t_cache) - 1)
    ms_full = 1e3 * sum(t_full[1:]) / (len(t_full) - 1)
    print(f"with cache:    {ms_cache:7.2f} ms/token")
    print(f"without cache: {ms_full:7.2f} ms/token")
    print(f"speed-up: {ms_full / ms_cache:.1f}x (goal >= 5x)")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    positions = range(args.prompt_len, args.prompt_len + args.new_tokens)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(positions, [1e3 * t for t in t_full], label="without cache (reruns the sequence)")
    ax.plot(positions, [1e3 * t for t in t_cache], label="with KV cache (one token per step)")
    ax.set(xlabel="position of the generated token", ylabel="time per token (ms)", yscale="log",
           title=f"Greedy decoding on CPU: {ms_full / ms_cache:.1f}x faster with the KV cache")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
