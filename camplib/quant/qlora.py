"""QLoRA (Dettmers et al. 2023): LoRA adapters trained on top of an NF4-quantized frozen base.

The base model's Linear weights are stored in NF4 with double quantization (about 4.13 bits per
weight instead of 16 or 32) and dequantized on the fly in each forward; only the small LoRA
matrices train, in full precision, and gradients flow *through* the dequantized base to them.
This module reuses both halves as they are: `camplib.lora.inject_lora` wraps the target Linears
(and freezes everything), then each wrapped Linear's `base` becomes a
`camplib.quant.layers.QuantLinear` in NF4. Merging B A into an NF4 base is not offered: the sum
would have to be quantized again (merge into a dequantized copy instead).
"""
from __future__ import annotations

from torch import nn

from camplib.lora import LoRALinear, inject_lora, matching_modules   # the same pattern rules, checked first
from camplib.memory import storage_bytes
from camplib.quant.layers import QuantLinear

__all__ = ["inject_qlora", "base_bytes"]


def inject_qlora(model: nn.Module, target_modules, r: int = 8, alpha: float = 16.0, dropout: float = 0.0,
                 blocksize: int = 64, double_quant: bool = True) -> list[str]:
    """LoRA on the target Linears of `model` (in place), their frozen weights in NF4. Every
    check (patterns, rank, block size) runs before the model changes."""
    for n in matching_modules(model, target_modules):           # NF4 needs whole blocks: say which layer does not fit
        shape = tuple(model.get_submodule(n).weight.shape)
        if (shape[0] * shape[1]) % blocksize:
            raise ValueError(f"{n}: weight of shape {shape} is not whole NF4 blocks of {blocksize}")
    names = inject_lora(model, target_modules, r, alpha, dropout)
    for n in names:
        layer: LoRALinear = model.get_submodule(n)
        layer.base = QuantLinear(layer.base, "nf4", blocksize, double_quant)
    return names


def base_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of the frozen base (NF4 codes, absmax and their constants of the quantized Linears,
    plus every other frozen tensor) and of the trainable adapters, counted from the storages."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad] + list(model.buffers())
    return {"base": storage_bytes(frozen), "adapters": storage_bytes(trainable)}
