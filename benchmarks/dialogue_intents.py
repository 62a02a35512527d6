"""p02's outcome, measured: intent accuracy per user turn of the dialogue model on held-out
conversations (camplib.dialogue.data: unseen phrasings, fresh order numbers and addresses), before
and after LoRA SFT, with each slot's accuracy and the turn at which state tracking breaks. The
same pieces as the notebook, with the course's reference masked loss.

The brief's claim: "over 90% intent-recognition accuracy". The `gpu` profile fine-tunes
SmolLM2-135M-Instruct (course/labs.toml); --profile ci builds the tiny camplib base; -p NAME VALUE
overrides a profile value (a mid-size point on a CPU: --profile ci -p sft_steps 200 -p n_test 60).

    .venv/bin/python benchmarks/dialogue_intents.py [--profile gpu] [-p NAME VALUE] [--threads 2]

A long run on a CPU: --save FILE writes the adapter (the LoRA tensors, the steps done, the losses
and the settings) every --save-every steps, so a run stopped early is not lost; --adapter FILE
evaluates a saved adapter without training (its settings replace the profile's), and
--models base (or tuned) evaluates one of the two. --examples N prints N wrong answers.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import tomllib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from camplib.dialogue.base import load_base  # noqa: E402
from camplib.dialogue.data import SLOTS, make_dialogues  # noqa: E402
from camplib.dialogue.evaluate import assistant_turns, evaluate  # noqa: E402
from camplib.dialogue.intents import predict_intents  # noqa: E402
from camplib.dialogue.masking import encode_chat, masked_cross_entropy, pad_batch  # noqa: E402
from camplib.dialogue.sft import batches_of, load_lora, lora_sft, lora_tensors  # noqa: E402

BRIEF = 0.90


def train(base, padded, p: dict, device: str, save: Path | None, save_every: int) -> dict:
    """LoRA SFT of a copy of the base with the course's masked loss (sft_for_grading's run),
    saving {"lora", "step", "losses", "settings", "seconds"} to `save` every save_every steps."""
    model = copy.deepcopy(base.model).to(device)
    t, losses = time.perf_counter(), []

    def on_step(step: int, loss: float) -> None:
        losses.append(loss)
        if step % 10 == 0 or step == 1:
            print(f"  step {step}: loss {loss:.4f}, {time.perf_counter() - t:.0f} s", flush=True)
        if save is not None and (step % save_every == 0 or step == p["sft_steps"]):
            tmp = save.with_suffix(".tmp")
            torch.save({"lora": lora_tensors(model, p["train_embeddings"]), "step": step, "losses": list(losses),
                        "settings": p, "seconds": time.perf_counter() - t}, tmp)
            tmp.replace(save)

    amp = torch.bfloat16 if device == "cuda" else None
    lora_sft(model, batches_of(padded, p["batch_size"], p["sft_steps"], 0), masked_cross_entropy, lr=p["lr"],
             r=p["lora_r"], alpha=2.0 * p["lora_r"], seed=0, train_embeddings=p["train_embeddings"],
             autocast_dtype=amp, on_step=on_step)
    return {"lora": lora_tensors(model, p["train_embeddings"]), "step": p["sft_steps"], "losses": losses,
            "seconds": time.perf_counter() - t}


def first_turn_truth(conversations) -> tuple[list[str], list[str]]:
    """The opening user turns of held-out conversations and the intent of the answer to each."""
    return ([c[0]["content"] for c in conversations],
            [c[1]["content"].split(";")[0].split(":")[1].strip() for c in conversations])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="gpu", choices=["ci", "gpu"])
    ap.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--save", type=Path, help="write the adapter here every --save-every steps")
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--adapter", type=Path, help="evaluate this saved adapter instead of training")
    ap.add_argument("--models", default="base,tuned", help="which to evaluate: base (untuned), tuned, or both")
    ap.add_argument("--examples", type=int, default=0, help="print this many wrong answers of each model")
    a = ap.parse_args()
    labs = tomllib.loads((ROOT / "course" / "labs.toml").read_text())["lab"]
    p = dict(next(lab for lab in labs if lab["id"] == "p02")["profiles"][a.profile])
    saved = torch.load(a.adapter, weights_only=False) if a.adapter else None
    if saved:
        p.update({k: v for k, v in saved["settings"].items() if k not in ("n_test", "max_new_tokens")})
    p.update({k: json.loads(v) for k, v in a.param})
    if a.threads:
        torch.set_num_threads(a.threads)
    device = "cuda" if p["device"] == "cuda" and torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    base = load_base(p["base_source"], device=device, vocab_size=p["vocab_size"], stdlib_chars=p["stdlib_chars"],
                     seed=0, n_train=p["n_train"], d_model=p["d_model"], pretrain_steps=p["pretrain_steps"])
    tok = base.tokenizer
    data = make_dialogues(p["n_train"], p["n_test"], seed=0)
    padded = pad_batch([encode_chat(c, tok.encode) for c in data["train"]], tok.pad_id)
    which = set(a.models.split(","))
    rows = {"base (untuned)": base.model} if "base" in which else {}
    run = None
    if "tuned" in which:
        run = saved or train(base, padded, p, device, a.save, a.save_every)
        rows["after LoRA SFT"] = copy.deepcopy(base.model)
        load_lora(rows["after LoRA SFT"], run["lora"], r=p["lora_r"], alpha=2.0 * p["lora_r"])
    t = time.perf_counter()
    res = {name: evaluate(m, tok, data["test"], p["max_new_tokens"]) for name, m in rows.items()}
    firsts, truth = first_turn_truth(data["test"])
    predicted = {name: predict_intents(m, tok, firsts) for name, m in rows.items()}
    scored = {name: sum(i == y for (i, _), y in zip(got, truth)) / len(truth) for name, got in predicted.items()}
    eval_s, total_s = time.perf_counter() - t, time.perf_counter() - start
    print(f"p02 dialogue model, profile {a.profile!r} {p if a.param or saved else ''}: base {base.name}, {device}, "
          f"{torch.get_num_threads()} threads, {p['n_train']} training and {p['n_test']} held-out conversations, "
          + (f"LoRA r={p['lora_r']}, {run['step']} steps of {p['batch_size']}" if run else "untuned only")
          + (f" (adapter {a.adapter})" if saved else ""))
    print(f"{'':>16} {'intent acc':>10} " + " ".join(f"{s:>8}" for s in SLOTS) + f" {'exact':>6} {'stopped':>7} "
          f"{'1st-turn intent (scored)':>24}")
    for name, r in res.items():
        print(f"{name:>16} {r['intent_accuracy']:>10.3f} " + " ".join(f"{r['per_slot'][s]:>8.3f}" for s in SLOTS)
              + f" {r['exact_match']:>6.3f} {r['stopped']:>7.3f} {scored[name]:>24.3f}")
    for name, r in res.items():
        print(f"{name:>16} per turn: " + ", ".join(f"turn {k}: intent {v['intent_accuracy']:.3f}, exact "
                                                  f"{v['exact_match']:.3f} (n={v['n']})" for k, v in r["per_turn"].items()))
        print(f"{name:>16} state tracking first breaks at: {r['breaks_at']}")
        confidences = [c for _, c in predicted[name]]
        print(f"{name:>16} predict_intents mean confidence {sum(confidences) / len(confidences):.3f}")
    turns = assistant_turns(data["test"])
    for name, r in res.items():
        wrong = [(t, q) for t, q in zip(turns, r["predictions"]) if q["text"] != t["reference"]][:a.examples]
        for t, q in wrong:
            print(f"{name:>16} turn {t['turn']}: user {t['history'][-1]['content']!r}\n{'':>18}want "
                  f"{t['reference']!r}\n{'':>18}got  {q['text']!r}{'' if q['stopped'] else ' (no end of turn)'}")
    if run is None:
        print(f"evaluation {eval_s:.1f} s, total {total_s:.1f} s")
        return
    after = res["after LoRA SFT"]["intent_accuracy"]
    print(f"intent accuracy per user turn after SFT {after:.3f} (the brief: over {BRIEF:.2f}: "
          f"{'meets' if after > BRIEF else 'misses'} it); SFT {run['seconds']:.1f} s "
          f"({'saved earlier' if saved else 'this run'}), evaluation {eval_s:.1f} s, total {total_s:.1f} s; "
          f"loss {run['losses'][0]:.3f} -> {run['losses'][-1]:.3f}")


if __name__ == "__main__":
    main()
