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
- the token n-gram (`ngram_completer`): the same prompt and tokenizer as the p01 model, each next
  token the most likely under the counts (NgramModel.most_likely).
"""
from __future__ import annotations

from typing import Callable

import torch

from camplib.codegen.fim import fim_prompt
from camplib.generate import generate

__all__ = ["Completer", "bpe_completer", "smollm2_completer", "ngram_completer", "finished"]

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


def _greedy(model, ids: list[int], decode: Callable[[list[int]], str], stop_ids: set[int], line: bool,
            max_new_tokens: int) -> str:
    max_new_tokens = min(max_new_tokens, model.config.max_seq_len // 2)   # a small model's window: half for the prompt
    ids = ids[-(model.config.max_seq_len - max_new_tokens):]
    device = next(model.parameters()).device
    start = len(ids)

    def stop(idx):
        new = idx[0, start:].tolist()
        return bool(stop_ids & set(new)) or finished(decode(new), line)

    with torch.no_grad():
        out = generate(model.eval(), torch.tensor([ids], device=device), max_new_tokens, stop=stop)[0, start:].tolist()
    cut = next((i for i, t in enumerate(out) if t in stop_ids), len(out))
    text = decode(out[:cut])
    return text.split("\n", 1)[0] if line else text


def bpe_completer(model, bpe, max_new_tokens: int = 128) -> Completer:
    """The p01 model (camplib GPT + camplib ByteBPE with the FIM sentinels)."""
    special = set(bpe.special_tokens.values())

    def complete(prefix: str, suffix: str | None = None, *, line: bool = False, max_new_tokens: int = max_new_tokens):
        if suffix is not None:
            return _greedy(model, bpe.encode(fim_prompt(prefix, suffix), allow_special=True), bpe.decode, special,
                           line, max_new_tokens)
        prompt, healed = _heal(prefix)
        return _greedy(model, bpe.encode(prompt, allow_special=True), lambda ids: healed(bpe.decode(ids)), special,
                       line, max_new_tokens)
    return complete


def smollm2_completer(model, tokenizer, max_new_tokens: int = 256) -> Completer:
    """SmolLM2 (camplib GPT from camplib.gguf + its tokenizer): left to right, the suffix unused."""
    stop_ids = {i for i in (tokenizer.convert_tokens_to_ids("<|endoftext|>"), tokenizer.eos_token_id) if i is not None}

    def complete(prefix: str, suffix: str | None = None, *, line: bool = False, max_new_tokens: int = max_new_tokens):
        prompt, healed = _heal(prefix)
        return _greedy(model, tokenizer.encode(prompt, add_special_tokens=False),
                       lambda ids: healed(tokenizer.decode(ids, skip_special_tokens=False)), stop_ids, line, max_new_tokens)
    return complete


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
