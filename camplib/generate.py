"""Text generation from a camplib GPT: greedy decoding, temperature, top-k and top-p sampling,
a KV cache and batches of prompts padded on the left.

The logits processors are small pure functions on (..., vocab) logits, with the semantics of
transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper (applied in that
order, as `transformers.generate` does), so the distributions we sample from are the ones
practitioners know. A filtered token gets logit -inf, i.e. probability exactly 0.
"""
from __future__ import annotations

import torch

__all__ = ["greedy", "apply_temperature", "top_k_filter", "top_p_filter", "sample", "generate"]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The most likely token of each row: (..., vocab) -> (...). Ties go to the lowest id."""
    return logits.argmax(dim=-1)


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature: below 1 sharpens the distribution, above 1 flattens it."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to sample (use greedy for 0), got {temperature}")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row, set the rest to -inf.

    Ties with the k-th largest value are all kept (so a row may keep more than k tokens): which
    of several equal logits to drop would otherwise be arbitrary. transformers does the same.
    """
    if k <= 0:
        raise ValueError(f"top_k must be a positive integer, got {k}")
    k = min(k, logits.size(-1))
    kth_largest = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al. 2019): keep the smallest set of most likely tokens
    whose probabilities sum to >= p, and always at least the most likely one.

    A token is kept when the tokens more likely than it sum to less than p. Cuts the long
    tail of unlikely tokens, adaptively: few tokens survive when the model is sure, many when
    it is not. p >= 1 keeps everything. transformers keeps the same set, except that among
    equal probabilities at the boundary it keeps the higher token id where we keep the lower.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"top_p must be in [0, 1], got {p}")
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.float().softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False  # the top token always stays (matters for p == 0)
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row of (B, vocab) logits -> (B,), after temperature, top-k, top-p.

    temperature 0 means greedy (the limit of ever sharper distributions). Pass a seeded
    torch.Generator to make draws reproducible without touching the global RNG.
    """
    if temperature == 0:
        return greedy(logits)
    logits = apply_temperature(logits.float(), temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def _check_left_padded(mask: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    if mask.shape != idx.shape:
        raise ValueError(f"attention_mask {tuple(mask.shape)} must have the prompt's shape {tuple(idx.shape)}")
    mask = mask.to(device=idx.device, dtype=torch.long)
    # left padding: every row is 0...0 1...1, so the newest token of each row is real and the
    # model's last logits belong to the end of each prompt
    if not bool((mask[:, 1:] >= mask[:, :-1]).all()) or not bool(mask[:, -1].all()):
        raise ValueError("attention_mask must describe left padding (0s, then 1s, ending in a real token)")
    return mask


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, use_cache: bool = True,
             eos_id: int | None = None, attention_mask: torch.Tensor | None = None,
             generator: torch.Generator | None = None, stop=None, logits_hook=None) -> torch.Tensor:
    """Continue each prompt of idx (B, T) by up to max_new_tokens tokens -> (B, T + new).

    temperature 0 is greedy decoding; otherwise sample() with temperature, top_k, top_p.
    With use_cache the prompt is run once (prefill) and each step then feeds only the newest
    token, reading earlier keys/values from the model's KV cache: O(T) work per token instead
    of rerunning the whole sequence.

    attention_mask (B, T), 1 for real tokens and 0 for pads, allows prompts of different
    lengths padded on the LEFT, so every row's next token comes from the same last column.
    Each token is then placed at its position counted without pads and no query reads a pad:
    every row continues exactly as if it had been generated alone.

    eos_id: a row that emits it is finished; its later tokens are eos_id too, and generation
    stops early once every row is finished. Call model.eval() first if it has dropout.

    stop: a function of the tokens so far (B, T + new) that returns True to end generation
    there (a completion that has finished its line or its function; checked after each token).

    logits_hook: a function (tokens so far (B, T + new), next-token logits (B, V)) -> logits,
    applied before each token is chosen (to forbid tokens: set their logits to -inf).
    """
    B, T = idx.shape
    if T + max_new_tokens > model.config.max_seq_len:
        raise ValueError(f"{T} + {max_new_tokens} tokens exceed max_seq_len={model.config.max_seq_len}")
    padded = attention_mask is not None
    mask = _check_left_padded(attention_mask, idx) if padded else None
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0) if padded else None  # pads get 0, unused

    def forward(tokens, caches, mask, positions):
        if not padded:
            return model(tokens, caches=caches)[0][:, -1]
        return model(tokens, caches=caches, attention_mask=mask, positions=positions)[0][:, -1]

    caches = model.new_caches(B, T + max_new_tokens) if use_cache else None
    logits = forward(idx, caches, mask, positions)  # prefill (the whole prompt, once)
    finished = torch.zeros(B, dtype=torch.bool, device=idx.device)
    for step in range(max_new_tokens):
        if logits_hook is not None:
            logits = logits_hook(idx, logits)
        next_tok = sample(logits, temperature, top_k, top_p, generator)
        if eos_id is not None:
            next_tok = next_tok.masked_fill(finished, eos_id)
            finished |= next_tok == eos_id
        idx = torch.cat([idx, next_tok[:, None]], dim=1)
        if step + 1 == max_new_tokens or bool(finished.all()) or (stop is not None and stop(idx)):
            break
        if padded:
            mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
            positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
        if use_cache:  # only the new token; its keys/values join the cache
            logits = forward(next_tok[:, None], caches, mask, positions[:, -1:] if padded else None)
        else:  # the whole sequence again
            logits = forward(idx, None, mask, positions)
    return idx
