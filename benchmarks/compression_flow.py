"""a08's compression flow, measured: a06's intent classifier (MiniLM + head, the teacher) pruned
(layers, heads, MLP channels by Taylor importance), its vocabulary cut to the training requests'
tokens, distilled from the teacher's logits, then stored in int8; each stage's parameters
(embeddings and head included), bytes (its state dict written as safetensors), latency (median
forward of 32 held-out requests, tokenizing included) and held-out accuracy, in one run, with the
brief's claim beside it: "parameters 90% fewer with < 3 points accuracy lost". `--sweep` adds the
frontier: the final (int8) student of several sizes against the same teacher, and `--plot` draws
accuracy against parameters for both.

    .venv/bin/python benchmarks/compression_flow.py [--profile ci] [--threads 2] [--sweep] [--plot flow.png]

Default sizes are lab a08's `gpu` profile (course/labs.toml, the `flow_` settings: a06's full
teacher, MiniLM-L6 with LoRA r=8); the course's reference answers stand in for the student's
(camplib.compress.pruning.unit_importance, .vocabulary.restrict_vocabulary, .distill.distillation_loss).
"""
from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from camplib.compress.distill import distillation_loss  # noqa: E402
from camplib.compress.intent_flow import compress, quantized, stage_row, train_teacher  # noqa: E402
from camplib.compress.pruning import unit_importance  # noqa: E402
from camplib.compress.vocabulary import restrict_vocabulary  # noqa: E402
from camplib.intents import make_intent_dataset  # noqa: E402

BRIEF_RATIO, BRIEF_POINTS = 0.10, 3.0
SWEEP = [(1, 0.5, 0.25), (1, 1.0, 1.0), (2, 0.25, 0.125), (3, 0.5, 0.25), (4, 0.5, 0.5)]


def profile(name: str) -> dict:
    labs = tomllib.loads((ROOT / "course" / "labs.toml").read_text())["lab"]
    return next(lab for lab in labs if lab["id"] == "a08")["profiles"][name]


def student_settings(p: dict, keep_layers=None, keep_heads=None, keep_channels=None, seed: int = 0) -> dict:
    return dict(keep_layers=keep_layers or p["flow_keep_layers"], keep_heads=keep_heads or p["flow_keep_heads"],
                keep_channels=keep_channels or p["flow_keep_channels"], steps=p["flow_steps"],
                batch_size=p["flow_batch_size"], lr=p["flow_lr"], temperature=p["flow_temperature"],
                alpha=p["flow_alpha"], seed=seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="gpu", choices=["ci", "gpu"], help="lab a08's sizes to run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", action="store_true", help="also the final student at several sizes (the frontier)")
    ap.add_argument("--plot", default=None, help="save accuracy against parameters here (png)")
    a = ap.parse_args()
    p = profile(a.profile)
    torch.set_num_threads(a.threads)
    device = "cuda" if p["device"] == "cuda" and torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    data = make_intent_dataset(p["flow_train_per_intent"], p["flow_test_per_intent"], seed=a.seed)
    test = data["test"]
    teacher = train_teacher(data["train"], data["intents"], layers=p["flow_teacher_layers"],
                            lora_steps=p["flow_teacher_lora_steps"], seed=a.seed, device=device)
    teacher_s = time.perf_counter() - start
    print(f"teacher trained in {teacher_s:.1f} s", flush=True)
    rows = [stage_row("teacher", teacher, *test)]
    seconds = {"teacher": teacher_s}
    clock = [time.perf_counter()]

    def on_stage(name, clf):
        seconds[name] = time.perf_counter() - clock[0]
        rows.append(stage_row(name, clf, *test))
        clock[0] = time.perf_counter()

    fns = (unit_importance, restrict_vocabulary, distillation_loss)
    student = compress(teacher, *data["train"], *fns, on_stage=on_stage, **student_settings(p, seed=a.seed))
    t = time.perf_counter()
    rows.append(stage_row("int8", quantized(student), *test))
    seconds["int8"] = time.perf_counter() - t
    base = rows[0]
    s = student_settings(p)
    print(f"a08 compression flow, profile {a.profile!r}: {len(data['intents'])} intents, {len(data['train'][0])} training "
          f"and {len(test[0])} held-out requests; teacher MiniLM {p['flow_teacher_layers']} layers"
          f"{', LoRA r=8 ' + str(p['flow_teacher_lora_steps']) + ' steps' if p['flow_teacher_lora_steps'] else ', probe'}; "
          f"student {s['keep_layers']} layers, {s['keep_heads']:.0%} of heads, {s['keep_channels']:.0%} of MLP channels, "
          f"{s['steps']} distillation steps (T={s['temperature']}, alpha={s['alpha']}); {device}, {a.threads} threads, "
          f"seed {a.seed}")
    print(f"{'stage':>11} {'parameters':>11} {'of teacher':>10} {'bytes':>12} {'of teacher':>10} {'ms/32 req':>9} "
          f"{'held-out':>8} {'points':>7} {'seconds':>8}")
    for r in rows:
        print(f"{r['stage']:>11} {r['parameters']:>11,} {r['parameters'] / base['parameters']:>10.3f} {r['bytes']:>12,} "
              f"{r['bytes'] / base['bytes']:>10.3f} {r['ms']:>9.1f} {r['accuracy']:>8.3f} "
              f"{100 * (r['accuracy'] - base['accuracy']):>+7.1f} {seconds.get(r['stage'], 0):>8.1f}")
    final = rows[-1]
    lost = 100 * (base["accuracy"] - final["accuracy"])
    ratio = final["parameters"] / base["parameters"]
    print(f"final: {ratio:.1%} of the teacher's parameters ({1 - ratio:.1%} fewer), {final['bytes'] / base['bytes']:.1%} "
          f"of its bytes, {lost:+.1f} points of held-out accuracy lost; the brief: <= {BRIEF_RATIO:.0%} of the parameters "
          f"with < {BRIEF_POINTS:.0f} points lost: {'met' if ratio <= BRIEF_RATIO and lost < BRIEF_POINTS else 'NOT met'}")
    frontier = []
    if a.sweep:
        print(f"\nfrontier (int8 students against the same teacher, {s['steps']} steps each):")
        print(f"{'layers':>6} {'heads':>6} {'channels':>8} {'parameters':>11} {'of teacher':>10} {'bytes':>11} "
              f"{'held-out':>8} {'points':>7}")
        for layers, heads, channels in SWEEP:
            if layers > p["flow_teacher_layers"]:
                continue
            small = quantized(compress(teacher, *data["train"], *fns, **student_settings(p, layers, heads, channels, a.seed)))
            r = stage_row("int8", small, *test)
            frontier.append(r)
            print(f"{layers:>6} {heads:>6.3f} {channels:>8.3f} {r['parameters']:>11,} {r['parameters'] / base['parameters']:>10.3f} "
                  f"{r['bytes']:>11,} {r['accuracy']:>8.3f} {100 * (r['accuracy'] - base['accuracy']):>+7.1f}")
    print(f"total {time.perf_counter() - start:.1f} s")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
        ax.plot([r["parameters"] for r in rows], [r["accuracy"] for r in rows], "o-", label="stages of the flow")
        for r in rows:
            ax.annotate(r["stage"], (r["parameters"], r["accuracy"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        if frontier:
            ax.plot([r["parameters"] for r in frontier], [r["accuracy"] for r in frontier], "s", label="int8 students (sweep)")
        ax.axvline(BRIEF_RATIO * base["parameters"], color="grey", ls=":", label="10% of the teacher's parameters")
        ax.axhline(base["accuracy"] - BRIEF_POINTS / 100, color="tab:red", ls=":", label="teacher - 3 points")
        ax.set(xscale="log", xlabel="parameters (embeddings and head included)", ylabel="held-out accuracy",
               title=f"a08 compression flow ({a.profile} profile)")
        ax.legend(fontsize=8)
        fig.savefig(a.plot, dpi=110)
        print(f"plot saved to {a.plot}")


if __name__ == "__main__":
    main()
