"""LoRA (Hu et al. 2021): fine-tune a frozen Linear W through a trainable low-rank update B A.

    y = W x + b + (B A dropout(x)) * scale,   A: (r, in), B: (out, r), scale = alpha / r

A starts kaiming-uniform and B at zero, so training starts from exactly the pretrained model and
only r (in + out) numbers per layer are trained instead of in * out. rsLoRA (Kalajdzievski 2023)
uses scale = alpha / sqrt(r), which keeps the update's size stable as r grows. After training,
`merge` folds B A * scale into W: the adapted model then costs nothing extra at inference.

Interchangeable with `peft` (the library practitioners use): the same formula and initialisation
as `peft.tuners.lora.layer.Linear`, the same target-module matching rules, and adapters saved in
peft's format (`adapter_config.json` + `adapter_model.safetensors`, keys
`base_model.model.<module>.lora_A.weight`) that `PeftModel.from_pretrained` loads, and back.
Works on any torch model whose targets are `nn.Linear` (camplib's GPT, transformers' BERT/Llama).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LoRALinear", "inject_lora", "matching_modules", "lora_modules", "trainable_parameters", "merge_lora",
           "unmerge_lora", "lora_state_dict", "save_adapter", "load_adapter", "PEFT_PREFIX"]

PEFT_PREFIX = "base_model.model."        # peft's prefix for the wrapped model's module names
CONFIG_NAME, WEIGHTS_NAME = "adapter_config.json", "adapter_model.safetensors"


class LoRALinear(nn.Module):
    """A frozen `nn.Linear` (`base`) plus the trainable low-rank branch `lora_B @ lora_A`."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0,
                 use_rslora: bool = False):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRALinear wraps an nn.Linear, got {type(base).__name__}")
        if not isinstance(r, int) or r <= 0:
            raise ValueError(f"LoRA rank r must be a positive integer, got {r!r}")
        self.base = base
        self.r, self.alpha, self.use_rslora = r, float(alpha), bool(use_rslora)
        self.scale = self.alpha / (math.sqrt(r) if use_rslora else r)
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, dtype=w.dtype, device=w.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, dtype=w.dtype, device=w.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))     # as nn.Linear's default (and peft)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.merged = False
        for p in base.parameters():
            p.requires_grad_(False)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def delta_weight(self) -> torch.Tensor:
        """The update B A * scale, shaped like the base weight (out, in)."""
        return (self.lora_B @ self.lora_A) * self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.merged:
            return y
        # the same order of operations as peft, so fp32 results agree to rounding
        return y + F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B) * self.scale

    @torch.no_grad()
    def merge(self) -> None:
        """W += B A * scale; forward then skips the branch (same outputs, no extra cost)."""
        if not self.merged:
            self.base.weight += self.delta_weight().to(self.base.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W -= B A * scale: back to the frozen base plus a separate branch (to keep training)."""
        if self.merged:
            self.base.weight -= self.delta_weight().to(self.base.weight.dtype)
            self.merged = False

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha:g}, scale={self.scale:g}, merged={self.merged}"


def _matches(name: str, targets) -> bool:
    """peft's rule: a string is a regular expression matched against the whole name; a list
    matches a name equal to an entry or ending in '.' + entry."""
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def matching_modules(model: nn.Module, target_modules) -> list[str]:
    """Names of the nn.Linear modules that `target_modules` (peft's rules) selects; a clear error
    when it selects none."""
    if isinstance(target_modules, str):
        pass
    elif (not isinstance(target_modules, (list, tuple, set))
          or not all(isinstance(t, str) and t for t in target_modules) or not target_modules):
        raise ValueError(f"target_modules must be a regex string or a non-empty list of names, "
                         f"got {target_modules!r}")
    wrapped = [n for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    inside = lambda n: any(n == w or n.startswith(w + ".") for w in wrapped)   # already adapted
    found = [n for n, _ in model.named_modules() if n and _matches(n, target_modules) and not inside(n)]
    if not found:
        linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        raise ValueError(f"target_modules={target_modules!r} match no module of "
                         f"{type(model).__name__}; its Linear layers are e.g. {linears[:6]}")
    for n in found:
        m = model.get_submodule(n)
        if not isinstance(m, nn.Linear):
            raise TypeError(f"target module {n!r} is a {type(m).__name__}, LoRA here wraps only nn.Linear")
    return found


def inject_lora(model: nn.Module, target_modules, r: int = 8, alpha: float = 16.0,
                dropout: float = 0.0, use_rslora: bool = False) -> list[str]:
    """Freeze every parameter of `model` and replace each target `nn.Linear` by a LoRALinear
    (in place). Returns the names replaced. Checks everything first: on a bad pattern, a
    non-Linear target or a bad rank it raises and leaves the model unchanged."""
    if not isinstance(r, int) or r <= 0:
        raise ValueError(f"LoRA rank r must be a positive integer, got {r!r}")
    names = matching_modules(model, target_modules)
    for p in model.parameters():
        p.requires_grad_(False)
    for n in names:
        parent_name, _, child = n.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(getattr(parent, child), r, alpha, dropout, use_rslora))
    model.lora_config = {"r": r, "lora_alpha": float(alpha), "lora_dropout": float(dropout),
                         "use_rslora": bool(use_rslora),
                         "target_modules": target_modules if isinstance(target_modules, str)
                         else sorted(set(target_modules))}
    return names


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts, each shared (tied) tensor counted once."""
    seen, trainable, total = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total


def merge_lora(model: nn.Module) -> None:
    for m in lora_modules(model).values():
        m.merge()


def unmerge_lora(model: nn.Module) -> None:
    for m in lora_modules(model).values():
        m.unmerge()


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors under peft's names (the adapter name "default" left out, as peft saves)."""
    out = {}
    for n, m in lora_modules(model).items():
        out[f"{PEFT_PREFIX}{n}.lora_A.weight"] = m.lora_A.detach().clone().contiguous()
        out[f"{PEFT_PREFIX}{n}.lora_B.weight"] = m.lora_B.detach().clone().contiguous()
    return out


def save_adapter(model: nn.Module, folder: str | Path, base_model_name_or_path: str | None = None) -> Path:
    """Write adapter_config.json and adapter_model.safetensors in peft's format."""
    from safetensors.torch import save_file

    mods = lora_modules(model)
    if not mods:
        raise ValueError("the model has no LoRA modules to save (call inject_lora first)")
    if any(m.merged for m in mods.values()):
        raise ValueError("unmerge the LoRA modules before saving (merged weights live in the base)")
    cfg = getattr(model, "lora_config", None)
    if cfg is None:
        first = next(iter(mods.values()))
        cfg = {"r": first.r, "lora_alpha": first.alpha, "use_rslora": first.use_rslora,
               "lora_dropout": 0.0, "target_modules": sorted(mods)}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "task_type": None, "base_model_name_or_path": base_model_name_or_path,
              "inference_mode": True, "bias": "none", "fan_in_fan_out": False,
              "init_lora_weights": True, "modules_to_save": None, **cfg}
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2))
    save_file(lora_state_dict(model), str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    return folder


def _read_adapter(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} is missing: not a peft LoRA adapter folder")
    try:
        config = json.loads((folder / CONFIG_NAME).read_text())
        tensors = load_file(str(folder / WEIGHTS_NAME))
    except Exception as exc:  # corrupt JSON or safetensors: say which file
        raise ValueError(f"cannot read the adapter in {folder}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise ValueError(f"{folder / CONFIG_NAME}: peft_type is {config.get('peft_type') if isinstance(config, dict) else config!r}, expected 'LORA'")
    for key in ("rank_pattern", "alpha_pattern", "layers_to_transform", "modules_to_save"):
        if config.get(key):
            raise ValueError(f"{folder / CONFIG_NAME}: {key}={config[key]!r} is not supported here")
    if config.get("bias", "none") != "none" or config.get("fan_in_fan_out") or config.get("use_dora"):
        raise ValueError(f"{folder / CONFIG_NAME}: only plain LoRA (bias='none', no DoRA, nn.Linear) is supported")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0 or not isinstance(alpha, (int, float)):
        raise ValueError(f"{folder / CONFIG_NAME}: needs a positive integer r and a number lora_alpha, "
                         f"got r={r!r}, lora_alpha={alpha!r}")
    if not isinstance(config.get("target_modules"), (str, list)):
        raise ValueError(f"{folder / CONFIG_NAME}: target_modules must be a list or a regex, "
                         f"got {config.get('target_modules')!r}")
    return config, tensors


def load_adapter(model: nn.Module, folder: str | Path) -> list[str]:
    """Inject LoRA as the adapter's config says and load its A and B (a peft adapter or ours).
    Every name and shape is checked before the model is touched: an adapter for another
    architecture raises naming the module, and the model stays unchanged."""
    folder = Path(folder)
    config, tensors = _read_adapter(folder)
    r, alpha = config["r"], config["lora_alpha"]
    targets = config["target_modules"]
    if isinstance(targets, list):
        targets = sorted(targets)
    names = matching_modules(model, targets)
    expected = {}
    for n in names:
        base = model.get_submodule(n)
        expected[f"{PEFT_PREFIX}{n}.lora_A.weight"] = (r, base.in_features)
        expected[f"{PEFT_PREFIX}{n}.lora_B.weight"] = (base.out_features, r)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"adapter in {folder} does not fit {type(model).__name__}: "
                         f"missing {missing[:4]}, unexpected {unexpected[:4]}")
    for key, shape in expected.items():
        if tuple(tensors[key].shape) != shape:
            raise ValueError(f"adapter tensor {key} has shape {tuple(tensors[key].shape)}, "
                             f"the model needs {shape}")
    inject_lora(model, targets, r=r, alpha=alpha, dropout=float(config.get("lora_dropout", 0.0)),
                use_rslora=bool(config.get("use_rslora", False)))
    with torch.no_grad():
        for n, m in lora_modules(model).items():
            m.lora_A.copy_(tensors[f"{PEFT_PREFIX}{n}.lora_A.weight"])
            m.lora_B.copy_(tensors[f"{PEFT_PREFIX}{n}.lora_B.weight"])
    return names
