"""Cutting a model's vocabulary to the tokens a task uses (lab a08's compression flow).

A pretrained encoder carries an embedding row for every token of its tokenizer: MiniLM's 30522 x
384 word embeddings are 11.7M of its 22.7M parameters. A classifier of help-desk requests reads a
few hundred distinct tokens; keeping only the rows of the tokens seen in the *training* requests
(plus [UNK], which every other id is sent to) removes half the model and changes nothing for
those tokens. Tokens first seen at test time become [UNK]: the held-out accuracy says what that
costs. (Vocabulary trimming of multilingual models, Abdaoui et al. 2020, "Load What You Need".)
"""
from __future__ import annotations

import torch

__all__ = ["restrict_vocabulary"]


def restrict_vocabulary(weight: torch.Tensor, used_ids, unk_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (V, d), the token ids to keep, the [UNK] id -> (new weight (K, d), remap (V,) long).

    The kept ids are the distinct `used_ids` and `unk_id`, in increasing order; row i of the new
    weight is a copy of the old row kept[i], remap[kept[i]] = i, and every id not kept maps to the
    new row of [UNK]."""
    V = weight.shape[0]
    used = torch.as_tensor(used_ids, dtype=torch.long).reshape(-1).cpu()
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= V):
        raise ValueError(f"token ids must lie in [0, {V}), got [{int(used.min())}, {int(used.max())}]")
    if not 0 <= unk_id < V:
        raise ValueError(f"unk_id={unk_id} is not a row of the ({V}, {weight.shape[-1]}) embedding")
    kept = torch.unique(torch.cat([used, torch.tensor([unk_id])]))
    remap = torch.full((V,), int(torch.searchsorted(kept, torch.tensor(unk_id))), dtype=torch.long)
    remap[kept] = torch.arange(kept.numel())
    return weight.detach()[kept.to(weight.device)].clone(), remap
