"""Saving the p01 model as a folder `transformers.LlamaForCausalLM.from_pretrained` loads.

The weight mapping (fused qkv split into q/k/v projections, names, config) is camplib.hf's
`to_hf`; this file only writes the result with `save_pretrained` (config.json and
model.safetensors) and, beside it, the camplib tokenizer (transformers has no class for our
byte-level BPE, so it is saved in camplib's own JSON format, `ByteBPE.load` reads it).
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from camplib.hf import to_hf
from camplib.model import GPT
from camplib.tokenizer import ByteBPE

__all__ = ["save_hf", "load_hf_llama"]

TOKENIZER_FILE = "camplib_tokenizer.json"


@contextmanager
def _no_progress_bars():
    """transformers draws "Writing model shards" / "Loading weights" bars on stderr, which a
    graded notebook cell must keep clean (nbgrader scores a cell that writes there 0)."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()


def save_hf(model: GPT, folder: str | Path, bpe: ByteBPE | None = None) -> Path:
    """Write model (a Llama-style camplib GPT) to folder in transformers' format; returns folder."""
    if model.config.pos != "rope" or model.config.norm != "rmsnorm":
        raise ValueError("save_hf writes LlamaForCausalLM folders: the model must be Llama style "
                         "(GPTConfig.llama_style)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf_model = to_hf(model)
    with _no_progress_bars():
        hf_model.save_pretrained(folder, safe_serialization=True)
    if bpe is not None:
        bpe.save(folder / TOKENIZER_FILE)
    return folder


def load_hf_llama(folder: str | Path, dtype: torch.dtype = torch.float32):
    """The saved folder as a transformers LlamaForCausalLM (eval mode, eager attention)."""
    from transformers import LlamaForCausalLM

    with _no_progress_bars():
        return LlamaForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()
