"""Models described by plain data, for code that runs on ranks.

A spec is a dict, so it crosses any process boundary (a forked rank, the grader's sandbox) where
a module object cannot; every rank rebuilds the same model from it:

    {"kind": "mlp", "sizes": [16, 64, 64, 8]}          # Linear-GELU-...-Linear, trained with MSE
        "activation": "gelu" | "tanh", "batchnorm": True (BatchNorm1d after each hidden Linear)
    {"kind": "gpt", "config": {GPTConfig kwargs}}      # camplib.model.GPT, its own next-token loss
    both: "seed" (default 0) and "dtype" ("float32", "float64", "bfloat16", "float16")
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["DTYPES", "build_model", "model_with_weights", "batch_loss"]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
ACTIVATIONS = {"gelu": nn.GELU, "tanh": nn.Tanh}


def build_model(spec: dict, seed: int | None = None) -> nn.Module:
    """The model `spec` describes, initialised from `seed` (else the spec's "seed", else 0);
    the caller's RNG state is left alone."""
    kind = spec.get("kind", "mlp")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.get("seed", 0) if seed is None else seed)
        if kind == "mlp":
            sizes, layers = spec["sizes"], []
            for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
                layers.append(nn.Linear(a, b))
                if i < len(sizes) - 2:
                    layers += [nn.BatchNorm1d(b)] if spec.get("batchnorm") else []
                    layers.append(ACTIVATIONS[spec.get("activation", "gelu")]())
            model = nn.Sequential(*layers)
        elif kind == "gpt":
            from camplib.model import GPT, GPTConfig
            model = GPT(GPTConfig(**spec["config"]))
        else:
            raise ValueError(f"unknown model kind {kind!r} (expected 'mlp' or 'gpt')")
    return model.to(DTYPES[spec.get("dtype", "float32")])


def model_with_weights(spec: dict, state: dict) -> nn.Module:
    """The model `spec` describes carrying the weights `state` (what a rank is handed), whatever
    seed the spec has or lacks."""
    model = build_model(spec, 0)
    model.load_state_dict(state)
    return model


def batch_loss(model: nn.Module, spec: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """MSE (computed in fp32) for an MLP, the model's own next-token loss for a GPT."""
    if spec.get("kind", "mlp") == "mlp":
        return nn.functional.mse_loss(model(x.to(next(model.parameters()).dtype)).float(), y.float())
    return model(x, y)[1]
