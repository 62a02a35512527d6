"""The models p01 compares on HumanEval, behind one call: `completer(prefix, suffix=None, *,
line=False, max_new_tokens=...)` returns the text greedy decoding writes at the cursor.

- `line=True` (single-line infilling): generation stops at the first newline it writes, and the
  text is cut there (a token may hold a newline and more);
- `line=False` (function completion): it stops once a non-blank line starts at column 0 (the
  function is over, camplib.codegen.humaneval.function_body), or at max_new_tokens.

Prompt formats, per model:
- the p01 model (`bpe_completer`, a camplib GPT with the project's ByteBPE): with a suffix,
  fill-in-the-middle `<|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>` (PSM, as it
  was trained, camplib.codegen.fim); without, the prefix; its special ids end the text;
- left to right, a prompt's final newline is moved into the completion (`_heal`, token healing);
- SmolLM2-135M-Instruct as shipped (`smollm2_completer`): it has no FIM tokens, so the prompt is
  the prefix alone (left to right, the suffix unused: the "L2R" baseline of the InCoder and FIM
  papers' infilling tables); `<|endoftext|>` and `<|im_end|>` end the text;
- SmolLM2 fine-tuned with FIM (`smollm2_fim_completer`, camplib.codegen.fim_tune): with a
  suffix, `<jupyter_start> prefix <jupyter_output> suffix <jupyter_code>`, three of its rare
  special tokens as sentinels, as it was trained (or fim_tune's SPM order, suffix first);
- the token n-gram (`ngram_completer`): the same prompt and tokenizer as the p01 model, each next
  token the most likely under the counts (NgramModel.most_likely).

`complete.many(items, line=..., max_new_tokens=..., batch_size=8)` (and `complete_many`, which
falls back to one call per item for the n-gram) completes a list of (prefix, suffix) pairs in
batches: one KV-cached generate per batch, prompts of similar length together.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from camplib.codegen.fim import fim_prompt
from camplib.generate import generate

__all__ = ["Completer", "bpe_completer", "smollm2_completer", "smollm2_fim_completer", "ngram_completer",
           "complete_many", "finished"]

Completer = Callable[..., str]


def finished(text: str, line: bool) -> bool:
    """Whether a completion is over: a newline (line mode), or a line started at column 0 (function
    mode: prompts end with a newline, so the body's lines are indented and such a line ends it)."""
    if line:
        return "\n" in text
    return any(part.strip() and not part[0].isspace() for part in text.split("\n"))


def _heal(prefix: str) -> tuple[str, Callable[[str], str]]:
    """Left to right, a prompt ending in a newline is one no training text tokenizes that way:
    byte-level BPEs merge the newline with the next line's indentation ("\\n   " is one token),
    so a model given a bare "\\n" writes another. As token healing does, the prompt drops that
    newline and the model's text loses its leading one (the line it writes starts there)."""
    if not prefix.endswith("\n"):
        return prefix, lambda text: text
    return prefix[:-1], lambda text: text[1:] if text.startswith("\n") else text


def _nonblank_hook(width: int, decoders: list, stop_ids: set[int], newline_ids: list[int],
                   indent_ids: list[int] | None = None):
    """generate's logits_hook for line mode: while a row's text is blank, it may neither stop
    (stop_ids) nor write a token that ends the line (one of newline_ids whose text, after the
    row's decoder, holds a newline: a healed newline first is allowed). With indent_ids (the
    whitespace-only tokens), while a row's text is empty it may only write one of them that
    gives it indentation (whitespace, no newline): the line is inside a block."""
    stops = sorted(stop_ids)

    def hook(idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        for b, (new, dec) in enumerate(zip(idx[:, width:].tolist(), decoders)):
            text = dec(new)
            if indent_ids is not None and not text:
                allowed = [t for t in indent_ids if (s := dec(new + [t])).isspace() and "\n" not in s]
                if allowed:
                    keep = logits[b, allowed]
                    logits[b] = float("-inf")
                    logits[b, allowed] = keep
                    continue
            if text.strip():
                continue
            banned = stops + [t for t in newline_ids if "\n" in dec(new + [t])]
            logits[b, banned] = float("-inf")
        return logits
    return hook


def _greedy_batch(model, prompts: Sequence[tuple[list[int], Callable[[list[int]], str]]], stop_ids: set[int],
                  line: bool, max_new_tokens: int, batch_size: int = 8,
                  newline_ids: list[int] | None = None, indent_ids: list[int] | None = None) -> list[str]:
    """Greedy completions of many (ids, decode) prompts, `batch_size` at a time through
    camplib.generate (KV cache; prompts of similar length together, padded on the left with an
    attention mask, so each row continues as it would alone). A batch ends once every row has
    finished (a stop id, or `finished` on its decoded text); each row's tokens are cut where it
    finished and at its first stop id, and its text at its first newline in line mode. With
    newline_ids (line mode), a line may not end before it has non-blank text (_nonblank_hook), and
    with indent_ids it starts with indentation."""
    max_new_tokens = min(max_new_tokens, model.config.max_seq_len // 2)   # a small model's window: half for the prompt
    keep = model.config.max_seq_len - max_new_tokens
    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i][0]))
    texts: list[str] = [""] * len(prompts)

    def cut(new: list[int]) -> list[int]:
        return new[:next((i for i, t in enumerate(new) if t in stop_ids), len(new))]

    for first in range(0, len(order), max(1, batch_size)):
        chosen = order[first:first + max(1, batch_size)]
        rows = [list(prompts[i][0])[-keep:] for i in chosen]
        decoders = [prompts[i][1] for i in chosen]
        width = max(map(len, rows))
        idx = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, r in enumerate(rows):
            idx[b, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[b, width - len(r):] = 1

        ends: list[int | None] = [None] * len(rows)   # where each row finished: it is cut there, as alone

        def stop(ids: torch.Tensor) -> bool:
            for b, (new, dec) in enumerate(zip(ids[:, width:].tolist(), decoders)):
                if ends[b] is None and (len(cut(new)) < len(new) or finished(dec(new), line)):
                    ends[b] = len(new)
            return all(e is not None for e in ends)

        padded = bool((mask == 0).any())
        with torch.no_grad():
            hook = _nonblank_hook(width, decoders, stop_ids, newline_ids, indent_ids) if line and newline_ids else None
            out = generate(model.eval(), idx.to(device), max_new_tokens, stop=stop, logits_hook=hook,
                           attention_mask=mask.to(device) if padded else None)[:, width:].tolist()
        for i, new, dec, end in zip(chosen, out, decoders, ends):
            text = dec(cut(new[:end]))
            texts[i] = text.split("\n", 1)[0] if line else text
    return texts


def _completer(prompt_of: Callable[[str, str | None], tuple[list[int], Callable]], model, stop_ids: set[int],
               max_new_tokens: int, newline_ids: list[int] | None = None,
               indent_ids: list[int] | None = None) -> Completer:
    """complete(prefix, suffix=None, *, line, max_new_tokens) and complete.many(items, *, line,
    max_new_tokens, batch_size) for a camplib GPT, given how to build a prompt's (ids, decode)."""
    def many(items, *, line: bool = False, max_new_tokens: int = max_new_tokens, batch_size: int = 8) -> list[str]:
        return _greedy_batch(model, [prompt_of(p, s) for p, s in items], stop_ids, line, max_new_tokens, batch_size,
                             newline_ids, indent_ids)

    def complete(prefix: str, suffix: str | None = None, *, line: bool = False, max_new_tokens: int = max_new_tokens):
        return many([(prefix, suffix)], line=line, max_new_tokens=max_new_tokens, batch_size=1)[0]
    complete.many = many
    return complete


def complete_many(complete: Completer, items: Sequence[tuple[str, str | None]], *, line: bool,
                  max_new_tokens: int, batch_size: int = 8) -> list[str]:
    """complete(prefix, suffix, line=..., max_new_tokens=...) for each (prefix, suffix) of items,
    batched where the completer can (`complete.many`: the GPT-based ones), one by one otherwise."""
    many = getattr(complete, "many", None)
    if many is not None:
        return many(items, line=line, max_new_tokens=max_new_tokens, batch_size=batch_size)
    return [complete(p, s, line=line, max_new_tokens=max_new_tokens) for p, s in items]


def bpe_completer(model, bpe, max_new_tokens: int = 128) -> Completer:
    """The p01 model (camplib GPT + camplib ByteBPE with the FIM sentinels)."""
    def prompt_of(prefix: str, suffix: str | None):
        if suffix is not None:
            return bpe.encode(fim_prompt(prefix, suffix), allow_special=True), bpe.decode
        prompt, healed = _heal(prefix)
        return bpe.encode(prompt, allow_special=True), lambda ids: healed(bpe.decode(ids))
    return _completer(prompt_of, model, set(bpe.special_tokens.values()), max_new_tokens)


def smollm2_completer(model, tokenizer, max_new_tokens: int = 256) -> Completer:
    """SmolLM2 (camplib GPT from camplib.gguf + its tokenizer): left to right, the suffix unused."""
    stop_ids = {i for i in (tokenizer.convert_tokens_to_ids("<|endoftext|>"), tokenizer.eos_token_id) if i is not None}

    def prompt_of(prefix: str, suffix: str | None):
        prompt, healed = _heal(prefix)
        return (tokenizer.encode(prompt, add_special_tokens=False),
                lambda ids: healed(tokenizer.decode(ids, skip_special_tokens=False)))
    return _completer(prompt_of, model, stop_ids, max_new_tokens)


def smollm2_fim_completer(model, tokenizer, max_new_tokens: int = 256, keep: int | None = None,
                          order: str = "psm", nonblank: bool = False, in_block: bool = False) -> Completer:
    """SmolLM2 after FIM fine-tuning (camplib.codegen.fim_tune): with a suffix, the prompt is
    `<jupyter_start> prefix <jupyter_output> suffix <jupyter_code>` (fim_tune.SENTINELS, the
    format it was trained on; order="spm": fim_tune's SPM prompt, suffix first, and the prefix's
    final newline dropped from what the model writes, fim_middle_text), and the model writes the
    middle; without one, as smollm2_completer.
    keep: at most that many ids of prefix and suffix (fim_prompt_ids' cut, as in training).
    nonblank: in line mode the line may not end (end of text, newline) before it has non-blank
    text (every HumanEval infilling middle is a non-blank line).
    in_block: nonblank, and in line mode the line starts with indentation (it is inside a block,
    as every HumanEval infilling middle is: a function body's line)."""
    from camplib.codegen.fim_tune import fim_middle_text, fim_prompt_ids, fim_tokens

    stop_ids = set(fim_tokens(tokenizer)) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731

    def prompt_of(prefix: str, suffix: str | None):
        if suffix is not None:
            middle = fim_middle_text(prefix, order)
            return fim_prompt_ids(tokenizer, prefix, suffix, keep=keep, order=order), lambda ids: middle(decode(ids))
        prompt, healed = _heal(prefix)
        return tokenizer.encode(prompt, add_special_tokens=False), lambda ids: healed(decode(ids))
    newline_ids = indent_ids = None
    if nonblank or in_block:
        texts = [decode([t]) for t in range(model.config.vocab_size)]
        newline_ids = [t for t, x in enumerate(texts) if "\n" in x]
        indent_ids = [t for t, x in enumerate(texts) if x.isspace()] if in_block else None
    return _completer(prompt_of, model, stop_ids, max_new_tokens, newline_ids, indent_ids)


def ngram_completer(ngram, bpe, max_new_tokens: int = 128) -> Completer:
    """Greedy decoding of a camplib.codegen.baselines.NgramModel with the p01 prompt format."""
    special = set(bpe.special_tokens.values())

    def complete(prefix: str, suffix: str | None = None, *, line: bool = False, max_new_tokens: int = max_new_tokens):
        prompt, healed = (fim_prompt(prefix, suffix), lambda text: text) if suffix is not None else _heal(prefix)
        ids = bpe.encode(prompt, allow_special=True)
        out: list[int] = []
        for _ in range(max_new_tokens):
            tok = ngram.most_likely(ids + out)
            if tok in special:
                break
            out.append(tok)
            if finished(healed(bpe.decode(out)), line):
                break
        text = healed(bpe.decode(out))
        return text.split("\n", 1)[0] if line else text
    return complete
