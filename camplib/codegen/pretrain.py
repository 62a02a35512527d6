"""Pretraining the p01 code model: camplib's Llama-style GPT, Trainer, AdamW and warm-up schedule
on the stdlib corpus, with FIM applied to a fraction of the training chunks.

Nothing here is new machinery: the point of the project is wiring the course's pieces together
(camplib.tokenizer, .data, .model, .optim, .schedule, .trainer, .serving) and measuring the
result honestly. `pretrain` evaluates on held-out chunks every `eval_every` steps and hands the
validation loss to `report(step, loss)`, which is how an Optuna trial reports intermediate values
(and how its pruner stops it: `report` raises optuna.TrialPruned).

bf16: on a CUDA device that supports it the forward passes run under torch.autocast(bf16) (the
Trainer refuses fp16, which would need loss scaling); on the CPU everything stays fp32.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from camplib.codegen.corpus import CodeCorpus, encode_blocks, load_corpus, train_tokenizer
from camplib.codegen.fim import apply_fim
from camplib.data import make_loader
from camplib.model import GPT, GPTConfig
from camplib.optim import decay_param_groups
from camplib.schedule import warmup_scheduler
from camplib.serving.loading import save_for_serving
from camplib.tokenizer import ByteBPE
from camplib.trainer import Trainer

__all__ = ["PretrainConfig", "CodeData", "prepare_data", "build_model", "validation_loss", "pretrain",
           "save_code_model", "pretrain_code_model", "autocast_dtype_for"]


@dataclass
class PretrainConfig:
    n_train_files: int = 8
    n_val_files: int = 2
    chunk_chars: int = 256
    vocab_size: int = 512
    block_size: int = 64
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 2
    steps: int = 150
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 15
    weight_decay: float = 0.1
    fim_rate: float = 0.5
    seed: int = 0
    device: str = "cpu"
    eval_every: int = 50
    ckpt_dir: str | None = None   # Trainer checkpoints (last.pt) here; an existing one is resumed
    ckpt_every: int = 0


@dataclass
class CodeData:
    bpe: ByteBPE
    corpus: CodeCorpus
    train_blocks: torch.Tensor    # (n, block_size + 1), FIM applied
    val_blocks: torch.Tensor      # (n, block_size + 1), plain left-to-right text


def prepare_data(cfg: PretrainConfig, fim: Callable = apply_fim) -> CodeData:
    """Corpus, tokenizer (trained on the training chunks only), packed blocks. `fim(docs, rate,
    seed)` transforms the training chunks (the student's apply_fim in the lab)."""
    corpus = load_corpus(cfg.n_train_files, cfg.n_val_files, cfg.chunk_chars)
    bpe = train_tokenizer(corpus.train, cfg.vocab_size)
    train = encode_blocks(bpe, corpus.train, cfg.block_size, lambda docs: fim(docs, cfg.fim_rate, cfg.seed))
    val = encode_blocks(bpe, corpus.val, cfg.block_size)
    return CodeData(bpe, corpus, train, val)


def build_model(cfg: PretrainConfig, vocab_size: int) -> GPT:
    """A Llama-style GPT (RMSNorm, SwiGLU, RoPE, GQA, untied head), seeded by cfg.seed. Its
    context is twice the training block, so completions can run past one block."""
    torch.manual_seed(cfg.seed)
    gcfg = GPTConfig.llama_style(vocab_size=vocab_size, d_model=cfg.d_model, n_layer=cfg.n_layer,
                                 n_head=cfg.n_head, n_kv_head=cfg.n_kv_head, max_seq_len=2 * cfg.block_size)
    return GPT(gcfg)


def autocast_dtype_for(device: str | torch.device) -> torch.dtype | None:
    """bf16 on a CUDA device that has it, else None (fp32)."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


@torch.no_grad()
def validation_loss(model: GPT, blocks: torch.Tensor, batch_size: int = 64) -> float:
    """Mean per-token loss over all blocks (every target counted once), in eval mode."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(blocks), batch_size):
        block = blocks[start:start + batch_size].to(device)
        with torch.autocast(device.type, dtype=autocast_dtype_for(device)) if autocast_dtype_for(device) else _null():
            _, loss = model(block[:, :-1], block[:, 1:])
        total += float(loss) * block[:, 1:].numel()
        count += block[:, 1:].numel()
    model.train(was_training)
    return total / count


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def pretrain(cfg: PretrainConfig, data: CodeData, report: Callable[[int, float], None] | None = None,
             progress: bool = False, stop_after: int | None = None) -> tuple[GPT, Trainer, list[tuple[int, float]]]:
    """Train a new model for cfg.steps optimizer steps (resuming cfg.ckpt_dir/last.pt if there).
    stop_after=k stops after step k as if the run were killed there (the schedule still spans
    cfg.steps), so a later call resumes it from its checkpoint.

    Returns (model, trainer, [(step, validation loss), ...]); trainer.losses is the training
    curve. `report(step, val_loss)` is called at each evaluation and may raise to stop the run."""
    if len(data.train_blocks) < 1 or len(data.val_blocks) < 1:
        raise ValueError("no training or validation blocks: use more files or a smaller block_size")
    model = build_model(cfg, data.bpe.vocab_size).to(cfg.device)
    optimizer = torch.optim.AdamW(decay_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95))
    scheduler = warmup_scheduler(optimizer, "cosine", min(cfg.warmup, cfg.steps), cfg.steps, final_ratio=0.1)
    trainer = Trainer(model, optimizer, scheduler,
                      lambda epoch: make_loader(data.train_blocks, cfg.batch_size, seed=cfg.seed, epoch=epoch,
                                                drop_last=False),
                      clip=1.0, device=cfg.device, autocast_dtype=autocast_dtype_for(cfg.device),
                      ckpt_dir=cfg.ckpt_dir, ckpt_every=cfg.ckpt_every, progress=progress)
    if cfg.ckpt_dir is not None:
        trainer.resume()
    history: list[tuple[int, float]] = []

    def evaluate(t: Trainer) -> None:
        if cfg.eval_every and (t.step % cfg.eval_every == 0 or t.step == cfg.steps):
            loss = validation_loss(model, data.val_blocks)
            history.append((t.step, loss))
            if report is not None:
                report(t.step, loss)

    trainer.fit(min(cfg.steps, stop_after or cfg.steps), callback=evaluate)
    return model.eval(), trainer, history


def save_code_model(path: str | Path, model: GPT, bpe: ByteBPE) -> Path:
    """The serving checkpoint {"config", "model", "tokenizer"} that `camp serve` (p03) and
    camplib.serving.loading.load_camplib read; p02 fine-tunes the model it holds."""
    return save_for_serving(path, model.to("cpu"), bpe)


def pretrain_code_model(cfg: PretrainConfig | None = None, path: str | Path | None = None,
                        fim: Callable = apply_fim) -> tuple[GPT, ByteBPE, Path | None]:
    """The p01 model in one call, without the notebook: data, pretraining, and (when `path` is
    given) the serving checkpoint there. Returns (model in eval mode, tokenizer, path or None)."""
    cfg = cfg or PretrainConfig()
    data = prepare_data(cfg, fim)
    model, _, _ = pretrain(cfg, data)
    saved = save_code_model(path, model, data.bpe) if path is not None else None
    return model, data.bpe, saved
